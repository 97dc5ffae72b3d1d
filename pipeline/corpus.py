"""The stage every family starts from: the corpus (the configured directory of books, or a built-in one) cleaned,
deduplicated, decontaminated against the run's evaluation text and split into sentence shards
(data_prep/corpus/prepare.py), and how a later stage counts over those shards' texts, one Ray task per shard
(`count_over_shards`).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from omegaconf import DictConfig

from data_prep.corpus.builtin import BUILTIN_CORPORA
from data_prep.corpus.decontaminate import EvaluationOverlap
from data_prep.corpus.dedup import NearDuplicateOptions
from data_prep.corpus.prepare import prepare_corpus
from data_prep.corpus.sentences import default_splitter, splitter_identity
from data_prep.corpus.shards import MANIFEST_NAME, shard_paths
from pipeline.data_settings import DataConfig
from pipeline.downstream.settings import finetune_settings
from pipeline.downstream.task_data import evaluation_texts as task_evaluation_texts
from pipeline.downstream.tasks import in_corpus_form, load_task, resolve_task_dir, task_data_fingerprint, task_names
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.fingerprints import files_fingerprint
from pipeline.engine.settings import RayConfig, cache_dir_of, stages_in_run, typed_settings

if TYPE_CHECKING:  # with torch, which prepare loads only where the probes' text is read
    from pipeline.evaluation.senteval import SentevalConfig


@dataclass(frozen=True)
class EvaluationSources:
    """The text the run's scores come from, as its config names it: the fine-tune tasks (for the stages the run asks
    for, `pipeline.stages`, whatever `pipeline.until`, so a run stopped after prepare prepares what the full run
    reads) and, when the evaluate stage runs its probes, the `senteval` block."""
    tasks: tuple[str, ...]
    task_data_dir: str | None  # finetune.data_dir
    task_files_outside_data_dir: bool  # finetune.allow_files_outside_data_dir
    cache_dir: str
    senteval: SentevalConfig | None
    # data.nfkc and data.chinese_variant: the tasks' text is compared in the corpus's form (in_corpus_form), so that
    # a traditional-character dev sentence is found in a corpus converted to simplified ones
    text_form: tuple[bool, str] = (False, "keep")

    @classmethod
    def of(cls, cfg: DictConfig) -> EvaluationSources:
        """Made where prepare (or its cache key) begins."""
        stages, senteval = stages_in_run(cfg), None
        if "evaluate" in stages:
            from pipeline.evaluation.senteval import SentevalConfig  # torch: loaded only where the probes' text is read

            senteval = typed_settings(cfg.senteval, SentevalConfig)
        finetune, data = finetune_settings(cfg), typed_settings(cfg.data, DataConfig)  # schemas without a family
        return cls(tuple(task_names(finetune.task)) if "finetune" in stages else (), finetune.data_dir,
                   finetune.allow_files_outside_data_dir, cache_dir_of(cfg),
                   senteval if senteval and senteval.tasks else None, (data.nfkc, str(data.chinese_variant)))


def corpus_dir(data: DataConfig, cache_dir: str) -> Path:
    """The configured corpus, or the built-in one `data.corpus` names (downloaded on first use)."""
    if data.corpus_dir:
        return Path(data.corpus_dir).expanduser()
    return BUILTIN_CORPORA[data.corpus].fetch(cache_dir)


def prepare_workers(ray_settings: RayConfig) -> int:
    """The CPUs the running Ray has (a cluster's, all nodes together), or `ray.num_cpus` for the Ray that prepare
    starts itself: what prepare keeps busy. `ray.num_cpus` alone is what one training stage reserves, a node's worth
    on a cluster."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1))) if ray.is_initialized() else ray_settings.num_cpus


def evaluation_texts(sources: EvaluationSources) -> dict[str, list[str]]:
    """The text the run's scores come from, by source ("rotten_tomatoes dev", "zh_pos test", "senteval MR"): the dev
    split of every fine-tune task and its test split where it has one, and every text the evaluate stage's probes are
    scored on."""
    texts = {}
    for name in sources.tasks:
        task = in_corpus_form(load_task(name), *sources.text_form)
        splits = task_evaluation_texts(task, resolve_task_dir(task, sources.task_data_dir, sources.cache_dir))
        texts.update({f"{name} {split}": split_texts for split, split_texts in splits.items()})
    if sources.senteval is not None:
        from pipeline.evaluation import senteval  # with torch: loaded where SentEval's texts are read, not by workers

        # a task without data is the evaluate stage's to skip too; its data, once added, changes prepare's cache key
        # (_evaluation_fingerprint), and prepare runs again against it
        present, _ = senteval.tasks_with_data(sources.senteval, "so prepare does not decontaminate the corpus against "
                                                                "it, and the evaluate stage will skip it")
        texts.update({f"senteval {name}": sentences for name, sentences in senteval.evaluation_texts(present).items()})
    return texts


def decontamination(data: DataConfig, sources: EvaluationSources) -> EvaluationOverlap | None:
    if not data.decontaminate:
        return None
    return EvaluationOverlap.build(evaluation_texts(sources), data.decontamination_ngram)


def prepare(ctx: StageContext) -> dict:
    data, cache_dir = typed_settings(ctx.cfg.data, DataConfig), cache_dir_of(ctx.cfg)
    corpus = corpus_dir(data, cache_dir)
    manifest = prepare_corpus(corpus, ctx.stage_dir("prepare"), glob=data.glob, input_format=str(data.input_format),
                              shard_bytes=data.shard_bytes, min_tokens=data.min_tokens, max_tokens=data.max_tokens,
                              nfkc=data.nfkc, chinese_variant=str(data.chinese_variant),
                              num_workers=prepare_workers(typed_settings(ctx.cfg.ray, RayConfig)),
                              near_duplicates=None if data.near_duplicate_threshold is None
                              else NearDuplicateOptions(threshold=data.near_duplicate_threshold),
                              decontamination=decontamination(data, EvaluationSources.of(ctx.cfg)))
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


def count_shard_texts(index: int, shard_path: Path, count_texts: Callable[[list[str]], Counter]) -> Counter:
    return count_texts(read_arrow(shard_path).column("text").to_pylist())


def count_over_shards(ctx: StageContext, count_texts: Callable[[list[str]], Counter]) -> Counter:
    """count_texts (a word count) of every sentence shard's texts, one Ray task per shard, the counts added up as
    each arrives: one shard's counts held at a time, not one per shard (a thousand at 1 GB of books)."""
    counts = Counter()
    for _, shard_counts in ctx.shard_results(count_shard_texts, shard_paths(ctx.stage_dir("prepare")), count_texts):
        counts.update(shard_counts)
    return counts


def _fate(entry: dict) -> str:
    if entry.get("duplicate_of"):
        near = "near " if entry["status"] == "near_duplicate" else ""
        return f"{entry['book_id']}, a {near}copy of {entry['duplicate_of']}"
    return f"{entry['book_id']}: {entry.get('reason', entry['status'])}"


def _corpus_fingerprint(data: DataConfig, cache_dir: str) -> str:
    """The configured corpus's files, or the built-in corpus's pinned releases: planning never downloads."""
    if not data.corpus_dir:
        return BUILTIN_CORPORA[data.corpus].fingerprint
    return files_fingerprint(corpus_dir(data, cache_dir), data.glob, cache_dir)


def _evaluation_fingerprint(sources: EvaluationSources) -> str:
    """What decontamination reads: the fine-tune tasks' data and the SentEval tasks' files of the run."""
    parts = [f"{name}:" + task_data_fingerprint(load_task(name), sources.task_data_dir, sources.cache_dir,
                                                texts_only=True, allow_outside=sources.task_files_outside_data_dir)
             for name in sources.tasks]
    if sources.senteval is not None:
        from pipeline.evaluation.senteval import senteval_files_fingerprint

        parts.append(f"senteval:{senteval_files_fingerprint(sources.senteval, sources.cache_dir)}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _prepare_fingerprint(cfg: DictConfig) -> str:
    """The corpus, the evaluation text it is decontaminated against, and for raw text the sentence splitter this
    machine runs: blingfire and its aarch64 stand-in split some sentences differently (data_prep/corpus/sentences.py),
    so an x86-64 run's shards are not an aarch64 run's."""
    data, cache_dir = typed_settings(cfg.data, DataConfig), cache_dir_of(cfg)
    evaluation = _evaluation_fingerprint(EvaluationSources.of(cfg)) if data.decontaminate else "not decontaminated"
    key = f"{_corpus_fingerprint(data, cache_dir)} decontaminated against {evaluation}"
    if data.input_format != "raw":
        return key
    return f"{key} split by {splitter_identity(default_splitter())}"


PREPARE = Stage("prepare", prepare, (), ("data",), fingerprint=_prepare_fingerprint)
