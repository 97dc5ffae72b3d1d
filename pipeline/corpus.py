"""The stage every family starts from: the corpus (the configured directory of books, or a built-in one) cleaned,
deduplicated, decontaminated against the run's evaluation text and split into sentence shards
(data_prep/corpus/prepare.py).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from data_prep.corpus.builtin import BUILTIN_CORPORA
from data_prep.corpus.decontaminate import EvaluationOverlap
from data_prep.corpus.dedup import NearDuplicateOptions
from data_prep.corpus.prepare import prepare_corpus
from data_prep.corpus.sentences import default_splitter, splitter_identity
from data_prep.corpus.shards import MANIFEST_NAME
from pipeline.downstream.task_data import evaluation_texts as task_evaluation_texts
from pipeline.downstream.tasks import load_task, resolve_task_dir, task_data_fingerprint, task_names
from pipeline.engine.dag import Stage, StageContext, files_fingerprint


def corpus_dir(cfg: DictConfig) -> Path:
    """The configured corpus, or the built-in one `data.corpus` names (downloaded on first use)."""
    if cfg.data.corpus_dir:
        return Path(cfg.data.corpus_dir).expanduser()
    return BUILTIN_CORPORA[cfg.data.corpus].fetch(cfg.paths.cache_dir)


def prepare_workers(cfg: DictConfig) -> int:
    """The CPUs the running Ray has (a cluster's, all nodes together), or `ray.num_cpus` for the Ray that prepare
    starts itself: what prepare keeps busy. `ray.num_cpus` alone is what one training stage reserves, a node's worth
    on a cluster."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1))) if ray.is_initialized() else int(cfg.ray.num_cpus)


def _finetune_tasks(cfg: DictConfig) -> list[str]:
    return task_names(cfg.finetune.task) if "finetune" in cfg.pipeline.stages else []


def _senteval_in_run(cfg: DictConfig) -> bool:
    return "evaluate" in cfg.pipeline.stages and bool(cfg.senteval.tasks)


def _senteval_tasks_present(cfg: DictConfig) -> DictConfig:
    """The `senteval` block with only the tasks whose data is there. A missing one is the evaluate stage's to report
    when it runs; its data, once added, changes prepare's cache key (_evaluation_fingerprint), and prepare runs
    again against it."""
    from pipeline.evaluation import senteval

    present = {name: spec for name, spec in cfg.senteval.tasks.items()
               if senteval.task_paths(cfg.senteval)[name].exists()}
    for name in cfg.senteval.tasks.keys() - present.keys():
        print(f"prepare: senteval task {name}'s data is not at {senteval.task_paths(cfg.senteval)[name]}: the corpus "
              "is not decontaminated against it", flush=True)
    return OmegaConf.merge(OmegaConf.masked_copy(cfg.senteval, [k for k in cfg.senteval if k != "tasks"]),
                           {"tasks": present})


def evaluation_texts(cfg: DictConfig) -> dict[str, list[str]]:
    """The text the run's scores come from, by source ("rotten_tomatoes dev", "zh_pos test", "senteval MR"): the dev
    split of every fine-tune task and its test split where it has one, and every text the evaluate stage's probes are
    scored on, for the stages the run asks for (`pipeline.stages`, whatever `pipeline.until`, so a run stopped after
    prepare prepares what the full run reads)."""
    texts = {}
    for name in _finetune_tasks(cfg):
        task = load_task(name)
        splits = task_evaluation_texts(task, resolve_task_dir(task, cfg.finetune.data_dir, cfg.paths.cache_dir))
        texts.update({f"{name} {split}": split_texts for split, split_texts in splits.items()})
    if _senteval_in_run(cfg):
        from pipeline.evaluation import senteval  # with torch: loaded where SentEval's texts are read, not by workers

        texts.update({f"senteval {name}": sentences
                      for name, sentences in senteval.evaluation_texts(_senteval_tasks_present(cfg)).items()})
    return texts


def decontamination(cfg: DictConfig) -> EvaluationOverlap | None:
    if not cfg.data.decontaminate:
        return None
    return EvaluationOverlap.build(evaluation_texts(cfg), int(cfg.data.decontamination_ngram))


def prepare(ctx: StageContext) -> dict:
    data = ctx.cfg.data
    corpus = corpus_dir(ctx.cfg)
    manifest = prepare_corpus(corpus, ctx.stage_dir("prepare"), glob=data.glob, input_format=data.input_format,
                              shard_bytes=int(data.shard_bytes), min_tokens=data.min_tokens,
                              max_tokens=data.max_tokens, nfkc=data.nfkc,
                              chinese_variant=str(data.chinese_variant), num_workers=prepare_workers(ctx.cfg),
                              near_duplicates=None if data.near_duplicate_threshold is None
                              else NearDuplicateOptions(threshold=data.near_duplicate_threshold),
                              decontamination=decontamination(ctx.cfg))
    return {"corpus_dir": str(corpus), **manifest["totals"], "decontamination": manifest["decontamination"]}


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
        return BUILTIN_CORPORA[cfg.data.corpus].fingerprint
    return files_fingerprint(corpus_dir(cfg), cfg.data.glob, cfg.paths.cache_dir)


def _evaluation_fingerprint(cfg: DictConfig) -> str:
    """What decontamination reads: the fine-tune tasks' data and the SentEval tasks' files of the run."""
    if not cfg.data.decontaminate:
        return "not decontaminated"
    parts = [f"{name}:{task_data_fingerprint(load_task(name), cfg.finetune.data_dir, cfg.paths.cache_dir, True)}"
             for name in _finetune_tasks(cfg)]
    if _senteval_in_run(cfg):
        from pipeline.evaluation.senteval import senteval_fingerprint

        parts.append(f"senteval:{senteval_fingerprint(cfg)}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _prepare_fingerprint(cfg: DictConfig) -> str:
    """The corpus, the evaluation text it is decontaminated against, and for raw text the sentence splitter this
    machine runs: blingfire and its aarch64 stand-in split some sentences differently (data_prep/corpus/sentences.py),
    so an
    x86-64 run's shards are not an aarch64 run's."""
    key = f"{_corpus_fingerprint(cfg)} decontaminated against {_evaluation_fingerprint(cfg)}"
    if cfg.data.input_format != "raw":
        return key
    return f"{key} split by {splitter_identity(default_splitter())}"


PREPARE = Stage("prepare", prepare, (), ("data",), fingerprint=_prepare_fingerprint)
