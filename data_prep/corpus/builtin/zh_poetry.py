"""The `zh_poetry` corpus: the Tang and Song poems and the Song ci of the npm package `chinese-poetry@2.0.1` (MIT),
in its traditional characters."""
from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path

from data_prep.corpus.builtin import fetch

CHINESE_POETRY = "chinese-poetry@2.0.1"


def zh_poetry_documents(package: Path) -> dict[str, list[str]]:
    """Document name -> poems (each its lines joined) of chinese-poetry's Tang and Song shi
    (dist/quantangshi/poet.*.json, not its error/ folder) and Song ci (dist/songci/ci.song.*.json), one document per
    file of the npm tarball."""
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
        package = fetch.npm_pack(CHINESE_POETRY, downloads)
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

    return fetch.built_once(cache_dir, "zh_poetry", build, "built-in corpus zh_poetry",
                            f"downloading {CHINESE_POETRY} from npm")
