"""The stage every family starts from: the corpus (the configured directory of books, or the built-in one) cleaned,
deduplicated and split into sentence shards (data_prep/prepare.py)."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from data_prep.builtin import DEFAULT_CORPUS
from data_prep.dedup import NearDuplicateOptions
from data_prep.prepare import prepare_corpus
from data_prep.sentences import default_splitter, splitter_identity
from data_prep.shards import MANIFEST_NAME
from pipeline.engine.dag import Stage, StageContext, files_fingerprint


def corpus_dir(cfg: DictConfig) -> Path:
    """The configured corpus, or the built-in one (downloaded on first use)."""
    return Path(cfg.data.corpus_dir).expanduser() if cfg.data.corpus_dir else DEFAULT_CORPUS.fetch(cfg.paths.cache_dir)


def prepare_workers(cfg: DictConfig) -> int:
    """The CPUs the running Ray has (a cluster's, all nodes together), or `ray.num_cpus` for the Ray that prepare
    starts itself: what prepare keeps busy. `ray.num_cpus` alone is what one training stage reserves, a node's worth
    on a cluster."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1))) if ray.is_initialized() else int(cfg.ray.num_cpus)


def prepare(ctx: StageContext) -> dict:
    data = ctx.cfg.data
    corpus = corpus_dir(ctx.cfg)
    manifest = prepare_corpus(corpus, ctx.stage_dir("prepare"), glob=data.glob, input_format=data.input_format,
                              shard_bytes=int(data.shard_bytes), min_tokens=data.min_tokens,
                              max_tokens=data.max_tokens, nfkc=data.nfkc, num_workers=prepare_workers(ctx.cfg),
                              near_duplicates=None if data.near_duplicate_threshold is None
                              else NearDuplicateOptions(threshold=data.near_duplicate_threshold))
    return {"corpus_dir": str(corpus), **manifest["totals"]}


def require_books(prepare_dir: Path, needed: int, purpose: str) -> None:
    """Fail, saying what became of the other files, when the prepared corpus has fewer than `needed` books: a corpus
    of copies of one book got "needs at least 2 books; got 1", without a word of the copies dropped as duplicates."""
    manifest_path = Path(prepare_dir) / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    totals = manifest["totals"]
    if totals["files_kept"] >= needed:
        return
    dropped = [_fate(entry) for entry in manifest["files"] if entry["status"] != "kept"]
    listed = "; ".join(dropped[:3]) + (f"; and {len(dropped) - 3} more" if len(dropped) > 3 else "")
    raise ValueError(f"{purpose}, so the corpus needs at least {needed} distinct books; prepare kept "
                     f"{totals['files_kept']} of the {totals['files_read']} files, dropping "
                     f"{totals['files_duplicate']} as exact duplicates, {totals['files_near_duplicate']} as near "
                     f"duplicates (data.near_duplicate_threshold) and rejecting {totals['files_rejected']}"
                     f"{': ' + listed if listed else ''} (every file's fate: {manifest_path}). Add books that are not "
                     "copies of one another to data.corpus_dir")


def _fate(entry: dict) -> str:
    if entry.get("duplicate_of"):
        near = "near " if entry["status"] == "near_duplicate" else ""
        return f"{entry['book_id']}, a {near}copy of {entry['duplicate_of']}"
    return f"{entry['book_id']}: {entry.get('reason', entry['status'])}"


def _corpus_fingerprint(cfg: DictConfig) -> str:
    """The configured corpus's files, or the built-in corpus's pinned releases: planning never downloads."""
    if not cfg.data.corpus_dir:
        return DEFAULT_CORPUS.fingerprint
    return files_fingerprint(corpus_dir(cfg), cfg.data.glob, cfg.paths.cache_dir)


def _prepare_fingerprint(cfg: DictConfig) -> str:
    """The corpus, and for raw text the sentence splitter this machine runs: blingfire and its aarch64 stand-in split
    some sentences differently (data_prep/sentences.py), so an x86-64 run's shards are not an aarch64 run's."""
    corpus = _corpus_fingerprint(cfg)
    if cfg.data.input_format != "raw":
        return corpus
    return f"{corpus} split by {splitter_identity(default_splitter())}"


PREPARE = Stage("prepare", prepare, (), ("data",), fingerprint=_prepare_fingerprint)
