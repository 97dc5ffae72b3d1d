"""The fine-tune stage: every configured task × model kind × train size × seed. The model kinds are the families'
(`finetune.models`; pipeline/families.py): BERT fine-tuned end to end (Devlin et al. 2019, §4; seed 003) next to the
same architecture from random initialisation, ELMo used feature-based (Peters et al. 2018, §3.3); a majority-class
and a bag-of-words logistic-regression baseline (pipeline/downstream/baselines.py) for TSV classification tasks.

A kind read from this run's pretraining is also fine-tuned from each encoder snapshot that pretraining wrote
(pretrain.encoder_snapshots), as `<kind>@<step>`; rows of a run with snapshots carry the `pretraining_steps` of their
encoder (the kind's own row: the stage's last step), which the report plots (pretrain_scaling.png).

One finished (task, model, size, seed) is one small JSON file, so a run killed half-way skips what it had finished.
The runs of a task that have none yet train side by side on the stage's Ray workers (finetune.parallel_runs; by default
one per CPU), or one after another in the stage's process; the task's rows are then read from those files either way.

One file of ~500 lines: the grid, its resumable per-cell rows and the summaries the report reads over them
(headline_results, label_efficiency, pretraining_scaling) share the row format written here; the summaries could move
beside the report, and were left here when the engine was split."""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, Subset

from data_prep.corpus.shards import write_json_atomically
from pipeline.data_settings import chinese_words_of
from pipeline.downstream.baselines import bow_logreg_scores, lead, lead_n_scores, w2v_mean_coverage, w2v_mean_scores
from pipeline.downstream.generation import output_summary
from pipeline.downstream.settings import BASELINES, FinetuneConfig, finetune_settings
from pipeline.downstream.task_data import (
    LengthGroupedBatchSampler,
    TaskData,
    read_task_files,
    repeated,
    scored_tasks,
    stratified_subsample,
    tsv_splits,
)
from pipeline.downstream.tasks import (
    TaskSplit,
    load_task,
    resolve_task_dir,
    task_data_fingerprint,
    task_min_steps,
    task_names,
)
from pipeline.downstream.word2vec import WORD2VEC, load_word2vec
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.family import FinetuneKind, TaskModels, TokenCoverage
from pipeline.engine.pretraining import keep_word_embeddings
from pipeline.engine.settings import all_cpus, cache_dir_of, typed_settings
from pipeline.engine.snapshots import encoder_snapshots, steps_trained
from pipeline.engine.stage_workers import StageWorkers
from pipeline.engine.training import (
    TrainerConfig,
    make_trainer,
    one_process_trainer_keys,
    trains_on_cuda,
    with_fast_kernels,
)
from pipeline.families import FAMILIES
from pipeline.schema import FreezeEmbeddings

MODEL_KINDS: dict[str, FinetuneKind] = {name: kind for family in FAMILIES
                                        for name, kind in family.finetune_kinds.items()}


TWINS = {kind.random_twin for kind in MODEL_KINDS.values() if kind.random_twin}


# The baselines fitted on the model kinds' labelled subsets, at every train size and seed (TSV classification
# tasks): name -> what gives its scorer, (task, train subset, dev, seed) -> scores.
SUBSET_BASELINES = {
    "bow_logreg": lambda ctx: bow_logreg_scores,
    "w2v_mean": lambda ctx: partial(w2v_mean_scores, vectors=load_word2vec(ctx.stage_dir(WORD2VEC.name)),
                                    chinese_words=chinese_words_of(ctx.cfg)),
}
assert set(SUBSET_BASELINES) < set(BASELINES)  # the schema's names (pipeline/downstream/settings.py)

# Baselines that train nothing, fitted once on the whole train split whatever finetune.train_sizes says (lead_n: the
# source's first N words, N one number chosen on train): the label-efficiency curve and table set them beside every
# size as a flat reference, where the models trained on that many examples are read against them, rather than as a
# point at all of the data
FLAT_BASELINES = ("lead_n",)
assert set(FLAT_BASELINES) < set(BASELINES)


def finetune_kinds(cfg: DictConfig, f: FinetuneConfig) -> dict[str, FinetuneKind]:
    """The kinds `finetune.models` names (names the config schema allows), each followed by its random-init twin
    where it has one and finetune.random_twins is on, and by its control in a run of `cfg` where that is another kind
    than the twin and finetune.controls is on; a kind comes once, where it first came."""
    names = []
    for name in f.models:
        kind = MODEL_KINDS[name]
        control = kind.control(cfg) if f.controls else None
        names += [name, kind.random_twin if f.random_twins else None,
                  control if control != kind.random_twin else None]
    return {name: MODEL_KINDS[name] for name in dict.fromkeys(names) if name}


def controls_in_run(cfg: DictConfig, kinds: dict[str, FinetuneKind]) -> dict[str, str]:
    """Each of `kinds` (those the run fine-tunes) whose control (FinetuneKind.control) is fine-tuned too -> the
    control's name: the rows the report sets beside each other."""
    return {name: control for name, kind in kinds.items() if (control := kind.control(cfg)) in kinds}


def check_controls(cfg: DictConfig) -> None:
    """Before any stage runs: a control kind (FinetuneKind.control_of) only in a run where it is its kind's control;
    elsewhere it would be a second, mislabelled copy of what the random twin (or no kind) already is."""
    for name in finetune_settings(cfg).models:
        of = MODEL_KINDS[name].control_of
        if of is not None and (control := MODEL_KINDS[of].control(cfg)) != name:
            raise ValueError(f"finetune.models has {name}, the control of {of} where its pretraining starts from the "
                             f"piece vectors, and in this run {control or 'no kind'} is {of}'s control; remove {name} "
                             "from finetune.models, or set pretrain.init_embeddings=word2vec for a pretraining from "
                             "scratch")


def finetune_upstream(cfg: DictConfig) -> tuple[str, ...]:
    f = finetune_settings(cfg)
    stages = [stage for kind in finetune_kinds(cfg, f).values() for stage in kind.upstream(cfg)]
    if "w2v_mean" in f.baselines:
        stages.append(WORD2VEC.name)
    return tuple(dict.fromkeys(stages))


def train_sizes(f: FinetuneConfig) -> list[int | None]:
    """finetune.train_sizes: labelled examples per fine-tuning run (None: all), in the order given."""
    sizes = list(f.train_sizes or [None])
    bad = [s for s in sizes if s is not None and s < 1]
    if bad:
        raise ValueError(f"finetune.train_sizes={sizes}: each must be a positive number of examples or null (all)")
    if repeated(sizes):
        raise ValueError(f"finetune.train_sizes={sizes} repeats {repeated(sizes)}: each size is one cell of the "
                         "label-efficiency table; give each once")
    return sizes


def finetune_seeds(f: FinetuneConfig) -> list[int]:
    """finetune.seeds: one run of every model kind per seed, aggregated as mean ± std. A seed gives the same run each
    time, so a repeated seed would be counted twice as if it were another sample (`0.5000 ± 0.0000 | 2`), and no seed
    gives a table of baselines alone."""
    seeds = list(f.seeds)
    if not seeds:
        raise ValueError("finetune.seeds=[]: fine-tuning needs at least one seed, e.g. finetune.seeds=[1,2,3] "
                         "(or leave finetune out of pipeline.stages)")
    if repeated(seeds):
        raise ValueError(f"finetune.seeds={seeds} repeats {repeated(seeds)}: a seed gives the same run every time, "
                         "so a repeat would count as another seed in the mean ± std; give distinct seeds")
    return seeds


def sizes_for_task(sizes: list[int | None], train_count: int, task: str) -> list[int | None]:
    """`sizes` for a task of `train_count` training examples, smallest first and all of them last: a size of at least
    that many is all of them, run once as null ("all"), instead of a copy of the all-data run whose label-efficiency
    cell would overwrite the other's. All of them last, where the headline table reads them."""
    whole = [s for s in sizes if s is not None and s >= train_count]
    if whole:
        print(f"finetune: finetune.train_sizes {', '.join(map(str, whole))} {'is' if len(whole) == 1 else 'are'} at "
              f"least the {train_count} training examples of task {task}: fine-tuned once on all of them, reported "
              "as 'all'", flush=True)
    return sorted(dict.fromkeys(None if s in whole else s for s in sizes), key=_size_key)


def _size_key(size: int | None) -> float:
    return float("inf") if size is None else size




def check_task_files(cfg: DictConfig) -> None:
    """The tasks' split to score, the train sizes a classification task can be fitted on, and the user's task files
    (finetune.data_dir) read as this stage will read them, so that a missing test split, a wrong label or a malformed
    row is reported before the first stage runs instead of after pretraining. Built-in data is ours."""
    f = finetune_settings(cfg)
    classifying = [task.name for task in scored_tasks(cfg, f) if task.format == "tsv" and task.labels is not None]
    if classifying and 1 in train_sizes(f):
        raise ValueError(f"finetune.train_sizes={list(f.train_sizes)}: a subset of 1 example holds a single label, "
                         f"from which no classifier learns to tell the labels apart (every model and baseline would "
                         f"predict that label); task {classifying[0]} needs sizes of at least 2")
    if not f.data_dir:
        return
    for name in task_names(f.task):
        task = load_task(name)
        read_task_files(task, resolve_task_dir(task, f.data_dir, cache_dir_of(cfg)), f.allow_files_outside_data_dir)


SNAPSHOT_MARK = "@"  # <kind>@<step>: the kind fine-tuned from its pretraining stage's encoder snapshot at that step


def is_snapshot(row: dict) -> bool:
    return SNAPSHOT_MARK in row["model"]


def model_sources(ctx: StageContext, f: FinetuneConfig) -> dict[str, tuple[TaskModels, int | None]]:
    """Each kind in finetune.models, loaded once for every task and seed, with the pretraining steps of its encoder
    where its pretraining stage wrote encoder snapshots (else None); and each of those snapshots, as <kind>@<step>."""
    sources = {}
    for name, kind in finetune_kinds(ctx.cfg, f).items():
        stage = kind.pretraining_stage(ctx.cfg) if kind.pretraining_stage else None
        snapshots = encoder_snapshots(ctx.stage_dir(stage)) if stage else {}
        final = steps_trained(ctx.stage_dir(stage)) if snapshots else None
        sources[name] = (kind.load(ctx), final)
        for step, directory in snapshots.items():
            if step != final:  # the snapshot at the last step is the stage's own encoder, fine-tuned as `name`
                sources[f"{name}{SNAPSHOT_MARK}{step}"] = (kind.load(replace(ctx, inputs={**ctx.inputs,
                                                                                         stage: directory})), step)
    return sources


def finetune_once(ctx: StageContext, f: FinetuneConfig, task: DictConfig, data: TaskData, models: TaskModels,
                  kind: str, seed: int, train_indices: np.ndarray, keeps_outputs: bool = True,
                  ) -> tuple[dict[str, float], dict]:
    """The dev scores of one fine-tuning run, and the fields its rows carry beside them (FinetuneModule.row_fields);
    `keeps_outputs`: its outputs are the ones the stage keeps (FinetuneModule.keeps_outputs)."""
    # the same head initialisation and data order for every model kind; quietly, as every run sets one
    L.seed_everything(seed, workers=True, verbose=False)
    model = with_fast_kernels(models.build(data), ctx.cfg)  # every kind's model, the kernels applied here alone
    train = Subset(data.train, train_indices.tolist())
    if f.group_by_length and data.train_lengths is not None:
        lengths = np.asarray(data.train_lengths)[train_indices]
        train_loader = DataLoader(train, batch_sampler=LengthGroupedBatchSampler(lengths, f.batch_size, seed),
                                  collate_fn=data.collate)
    else:
        train_loader = DataLoader(train, batch_size=f.batch_size, shuffle=True, collate_fn=data.collate,
                                  generator=torch.Generator().manual_seed(seed))
    dev_loader = DataLoader(data.dev, batch_size=f.eval_batch_size, collate_fn=data.collate)
    prefix = f"{task.name}/{kind}/n{len(train_indices)}/seed{seed}"
    encoder = getattr(model, "encoder", None)  # None: a head on frozen features, nothing of the encoder trains
    # What keeps pretrained features (frozen embeddings, slower lower layers) is for a pretrained encoder: a random
    # twin has nothing to keep, and frozen random vectors or slowed random layers would handicap the comparison. A
    # control keeps its start as the pretrained kind does, so that the two differ by the pretraining steps alone.
    pretrained = kind not in TWINS
    frozen = (word_embeddings(encoder) if f.freeze_embeddings != FreezeEmbeddings.none and encoder is not None
              and pretrained else None)
    if f.linear_probe_epochs and encoder is not None:
        # LP-FT (Kumar et al. 2022): the head first, on the frozen encoder, so that fine-tuning starts from a head that
        # fits the pretrained features instead of a random one whose gradients distort them
        trainable = [p for p in encoder.parameters() if p.requires_grad]  # a kind may keep part of it frozen
        encoder.requires_grad_(False)
        probe_steps = len(train_loader) * f.linear_probe_epochs
        probe = data.make_module(model, lr=f.lr, weight_decay=f.weight_decay,
                                 warmup_steps=int(f.warmup_fraction * probe_steps), total_steps=probe_steps)
        make_trainer(ctx, [], prefix=f"{prefix}/probe", one_process=True, max_epochs=f.linear_probe_epochs,
                     num_sanity_val_steps=0, enable_checkpointing=False, limit_val_batches=0).fit(probe, train_loader)
        for parameter in trainable:
            parameter.requires_grad_(True)
    if frozen is not None:
        # with_vector: the rows that started from a piece vector (TaskModels.pieces_with_vectors), as in pretraining
        keep_word_embeddings(frozen, f.freeze_embeddings, getattr(models, "pieces_with_vectors", None))
    epochs = finetune_epochs(f.epochs, max(f.min_steps, task_min_steps(task)), len(train_loader))
    total_steps = len(train_loader) * epochs
    module = data.make_module(model, lr=f.lr, weight_decay=f.weight_decay,
                              warmup_steps=int(f.warmup_fraction * total_steps), total_steps=total_steps)
    module.keeps_outputs = keeps_outputs
    if pretrained:
        module.encoder_lr_factor, module.layer_lr_decay = f.encoder_lr_factor, f.layer_lr_decay
    trainer = make_trainer(ctx, [], prefix=prefix, one_process=True,
                           max_epochs=epochs, num_sanity_val_steps=0, enable_checkpointing=False,
                           # dev is scored once, after the last epoch: no model is chosen by its dev score
                           check_val_every_n_epoch=epochs)
    trainer.fit(module, train_loader, dev_loader)
    return dict(module.scores), dict(module.row_fields)


def word_embeddings(encoder: nn.Module) -> nn.Embedding:
    """The encoder's word (token) embeddings: its nn.Embedding with the most rows (BERT's word_embeddings, GPT's
    wte; positions, segments and relative distances have far fewer)."""
    tables = [m for m in encoder.modules() if isinstance(m, nn.Embedding)]
    if not tables:
        raise ValueError(f"finetune.freeze_embeddings: {type(encoder).__name__} has no embedding table to freeze; "
                         "leave it none for this model kind")
    return max(tables, key=lambda m: m.num_embeddings)


def finetune_epochs(epochs: int, min_steps: int, steps_per_epoch: int) -> int:
    """finetune.epochs, raised until the run takes at least finetune.min_steps optimizer steps: a few hundred labelled
    examples give a handful of steps per epoch, too few to move a head, let alone an encoder (Mosbach et al. 2021,
    "On the Stability of Fine-tuning BERT", train small data sets for more iterations)."""
    return max(epochs, -(-min_steps // max(1, steps_per_epoch)))


# what a baseline's rows say of its coverage of the task (w2v_mean_coverage), and a model kind's of its tokens
# (token_coverage_fields), kept by the rows aggregated over seeds
COVERAGE_KEYS = ("coverage", "token_coverage", "coverage_warning")


def token_coverage_fields(task: str, kind: str, coverage: TokenCoverage | None, f: FinetuneConfig) -> dict:
    """What a kind's rows of `task` say of its inputs' coverage of the task's tokens (TaskModels.token_coverage; {}
    for a kind without one): above finetune.max_unknown_rate of them unknown to its tokenizer, or below
    finetune.w2v_min_coverage of them with a vector its word embeddings start from, also a warning, printed here and
    kept beside the rows for the report."""
    if coverage is None:
        return {}
    block = {"unknown_token": coverage.unknown_token, "unknown_rate": round(coverage.unknown_rate, 4),
             "high_unknown_rate": coverage.unknown_rate > f.max_unknown_rate}
    warnings = []
    if block["high_unknown_rate"]:
        warnings.append(f"{coverage.unknown_rate:.1%} of the tokens of task {task} are {coverage.unknown_token} to "
                        f"{kind}'s tokenizer, above finetune.max_unknown_rate={f.max_unknown_rate}: the tokenizer "
                        f"does not cover the task's script or register, and {kind} reads those words as one token; "
                        "train the tokenizer (pretrain) on text in the task's script and register")
    if coverage.vectors is not None:
        block.update(vectors=coverage.vectors, vector_coverage=round(coverage.vector_coverage, 4),
                     low_vector_coverage=coverage.vector_coverage < f.w2v_min_coverage)
        if block["low_vector_coverage"]:
            warnings.append(f"{kind}'s word embeddings start from {coverage.vectors} that cover "
                            f"{coverage.vector_coverage:.1%} of the tokens of task {task}, below "
                            f"finetune.w2v_min_coverage={f.w2v_min_coverage}: the others start from random rows, so "
                            f"the row measures what the corpus shares with the task more than the {coverage.vectors}; "
                            "pretrain on more text, or text nearer the task's")
    for warning in warnings:
        print(f"WARNING: {warning}", flush=True)
    return {"token_coverage": block, **({"coverage_warning": " ".join(warnings)} if warnings else {})}


def _aggregate(rows: list[dict]) -> list[dict]:
    """Mean ± std over seeds, one row per (model, task, metric, train size); `seeds` counts the seeds with a defined
    score."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["task"], row["metric"], row.get("train_size")), []).append(row)
    out = []
    for (model, task, metric, train_size), members in groups.items():
        every = np.array([m["score"] for m in members], dtype=float)
        # A correlation is undefined (NaN) when a model predicts a constant; such seeds are counted, not averaged.
        scores = every[~np.isnan(every)]
        out.append({"model": model, "task": task, "metric": metric,
                    "score": round(float(scores.mean()), 4) if len(scores) else float("nan"),
                    "std": round(float(scores.std(ddof=1)), 4) if len(scores) > 1 else 0.0,
                    "seeds": len(scores), "undefined_seeds": int(np.isnan(every).sum()),
                    "per_seed": [None if np.isnan(v) else round(float(v), 4) for v in every],
                    "train_size": train_size, "train_examples": members[0]["train_examples"],
                    "dev_examples": members[0]["dev_examples"], "scored_on": members[0].get("scored_on", "dev"),
                    "pretraining_steps": members[0].get("pretraining_steps"),
                    "seconds": round(sum(m["seconds"] for m in members), 1),
                    **{key: members[0][key] for key in COVERAGE_KEYS if key in members[0]},
                    **_outputs_fields(members)})
    return out


def _outputs_fields(members: list[dict]) -> dict:
    """What a generation task's aggregated row says of the outputs (generation.output_summary): the first seed's
    summary, with that seed, since the most frequent outputs of different seeds do not add up; and every seed's
    distinct share, to show whether the first is typical. {} for rows without one (other tasks, or finished/ files
    written before the summary existed)."""
    if "output_summary" not in members[0]:
        return {}
    return {"output_summary": {**members[0]["output_summary"], "seed": members[0]["seed"]},
            "distinct_share_per_seed": [m["output_summary"]["distinct_share"] for m in members
                                        if "output_summary" in m]}


@dataclass(frozen=True)
class FinetuneRun:
    """One fine-tuning run of the grid: a model kind on a task, at a train size (None: all) and seed."""
    task: DictConfig
    kind: str
    size: int | None
    seed: int
    # the headline run of its kind, the last seed at the largest size: the one whose outputs the stage keeps
    keeps_outputs: bool = False

    @property
    def tag(self) -> str:
        return f"{self.task.name}/{self.kind}/{'all' if self.size is None else self.size}/seed{self.seed}"


def finished_file(ctx: StageContext, tag: str) -> Path:
    """Where a finished run (or subset baseline) of the stage keeps its rows: a killed stage skips it on rerun."""
    return ctx.out_dir / "finished" / (tag.replace("/", "-") + ".json")


def train_run(ctx: StageContext, f: FinetuneConfig, run: FinetuneRun, data: TaskData, models: TaskModels,
              pretraining_steps: int | None) -> dict[str, float]:
    """Fine-tune `run` on its labelled subset and write its rows to its finished file: the one place a run's rows are
    made, whether it trains in the stage's process or in one of its workers (FinetuneWorker). Its scores."""
    # The same examples for every model kind at a given size and seed: rows differ by the encoder only.
    subset = stratified_subsample(data.train_labels, run.size, len(data.train),
                                  np.random.default_rng([run.seed, run.size or 0]))
    started = time.perf_counter()
    scores, fields = finetune_once(ctx, f, run.task, data, models, run.kind, run.seed, subset, run.keeps_outputs)
    write_json_atomically(finished_file(ctx, run.tag), [
        {"model": run.kind, "task": run.task.name, "metric": metric, "score": value, "seed": run.seed,
         "train_size": run.size, "train_examples": len(subset), "dev_examples": len(data.dev),
         "scored_on": scored_split(f), "pretraining_steps": pretraining_steps,
         "seconds": round(time.perf_counter() - started, 1), **fields} for metric, value in scores.items()])
    return scores


def scored_split(f: FinetuneConfig) -> str:
    return "train_holdout" if f.selection_fraction else str(f.score_split)


def print_scores(tag: str, scores: dict[str, float]) -> None:
    print(f"finetune {tag}: " + ", ".join(f"{m} {v:.4f}" for m, v in scores.items()), flush=True)


def runs_at_once(cfg: DictConfig, f: FinetuneConfig) -> int:
    """finetune.parallel_runs, or by default one run per CPU the stage is granted when training on a CPU, and one on
    a GPU, which a run of a small model already keeps busy from one process."""
    if f.parallel_runs is not None:
        return f.parallel_runs
    if trains_on_cuda(str(typed_settings(cfg.trainer, TrainerConfig).accelerator)):
        return 1
    return max(1, int(all_cpus(cfg)))


def encode_task(ctx: StageContext, f: FinetuneConfig, task: DictConfig, models: TaskModels) -> TaskData:
    """`task` as `models` read it, the same in the stage's process and in its workers."""
    return models.encode(task, resolve_task_dir(task, f.data_dir, cache_dir_of(ctx.cfg)), f, ctx.cfg.seed,
                         f.selection_fraction)


class FinetuneWorker:
    """A worker of the stage (engine/stage_workers.py) training runs handed to it one at a time: the stage's model
    kinds loaded once, and each task encoded once per tokenizer (the current task's kept, the previous one's dropped).
    It has no W&B run (the stage's is the stage process's): its Trainers log to CSV files in the stage directory, as
    a Ray Train worker's do (make_logger), and the stage prints each run's scores as it returns."""

    def __init__(self, ctx: StageContext, f: FinetuneConfig) -> None:
        self.ctx, self.f = ctx, f
        self.sources = model_sources(ctx, f)
        self.encoded: dict[tuple[str, object], TaskData] = {}

    def __call__(self, run: FinetuneRun) -> dict[str, float]:
        models, pretraining_steps = self.sources[run.kind]
        key = (run.task.name, models.encoding_key)
        if key not in self.encoded:
            self.encoded = {k: v for k, v in self.encoded.items() if k[0] == run.task.name}
            self.encoded[key] = encode_task(self.ctx, self.f, run.task, models)
        return train_run(self.ctx, self.f, run, self.encoded[key], models, pretraining_steps)


def train_runs(ctx: StageContext, f: FinetuneConfig, runs: list[tuple[FinetuneRun, TaskData]],
               sources: dict[str, tuple[TaskModels, int | None]], workers: StageWorkers | None) -> None:
    """Train `runs`, each with the task data encoded for its kind: on `workers` side by side, the runs on the most
    examples first (the longest, so that the last to finish is a short one and no worker waits long for it), or
    without workers one after another in this process."""
    if workers is None:
        for run, data in runs:
            print_scores(run.tag, train_run(ctx, f, run, data, models=sources[run.kind][0],
                                            pretraining_steps=sources[run.kind][1]))
        return
    longest_first = sorted(runs, key=lambda pair: -(pair[0].size or len(pair[1].train)))
    for i, scores in workers.results([(f"finetune {run.tag}", run) for run, _ in longest_first]):
        print_scores(longest_first[i][0].tag, scores)


def stage_workers(ctx: StageContext, f: FinetuneConfig) -> StageWorkers | contextlib.nullcontext:
    """The stage's workers where runs_at_once is above one, each granted its share of the stage's CPUs (a fraction
    where finetune.parallel_runs is above the CPUs), as many torch threads as whole CPUs in it; else none (None), and
    every run trains in the stage's process. None also where no Ray is running, rather than starting one unasked; and,
    unless finetune.parallel_runs asks for workers, where the stage function is called in a Ray driver (a test or a
    notebook) rather than run as the pipeline runs a stage, in a Ray task: a driver that once started Ray for
    something else would otherwise train its runs in workers that none of its patches and breakpoints reach."""
    import ray

    count = runs_at_once(ctx.cfg, f)
    if count == 1 or not ray.is_initialized():
        return contextlib.nullcontext()
    if f.parallel_runs is None and ray.get_runtime_context().get_task_id() is None:
        return contextlib.nullcontext()
    cpus = all_cpus(ctx.cfg) / count
    return StageWorkers(count, cpus, max(1, int(cpus)), FinetuneWorker, replace(ctx, wandb_run=None), f)


def finetune(ctx: StageContext) -> dict:
    f = finetune_settings(ctx.cfg)
    sources = model_sources(ctx, f)
    sizes, seeds = train_sizes(f), finetune_seeds(f)
    (ctx.out_dir / "finished").mkdir(exist_ok=True)
    rows = []
    with stage_workers(ctx, f) as workers:
        for task in scored_tasks(ctx.cfg, f):
            data_dir = resolve_task_dir(task, f.data_dir, cache_dir_of(ctx.cfg))
            encoded: dict[str, TaskData] = {}  # kinds with the same inputs (tokenizer) encode the task once
            task_sizes = None
            runs, unfinished = [], []
            for kind, (models, pretraining_steps) in sources.items():
                if models.encoding_key not in encoded:
                    encoded[models.encoding_key] = encode_task(ctx, f, task, models)
                data = encoded[models.encoding_key]
                measure = getattr(models, "token_coverage", None)  # optional (TaskModels): a kind may have none
                coverage = token_coverage_fields(task.name, kind, measure(data) if measure else None, f)
                if task_sizes is None:  # the same train split for every kind: its count, whatever it was encoded for
                    task_sizes = sizes_for_task(sizes, len(data.train), task.name)
                for size in task_sizes:
                    for seed in seeds:
                        run = FinetuneRun(task, kind, size, seed,
                                          keeps_outputs=(size, seed) == (task_sizes[-1], seeds[-1]))
                        runs.append((run, coverage))
                        if finished_file(ctx, run.tag).is_file():
                            print(f"finetune {run.tag}: found {finished_file(ctx, run.tag).name}, skipping")
                        else:
                            unfinished.append((run, data))
            train_runs(ctx, f, unfinished, sources, workers)
            # every run of the task finished: its rows as its finished file has them, in the grid's order
            for run, coverage in runs:
                rows += [{**row, **coverage} for row in json.loads(finished_file(ctx, run.tag).read_text())]
            if encoded:
                data = next(iter(encoded.values()))
                majority = data.majority_scores, len(data.train), len(data.dev)
            elif task.format == "tsv":  # no model kind (finetune.models=[]): the baselines alone, on the task's splits
                train, dev, majority_scores = tsv_splits(task, data_dir, f.max_train_examples, ctx.cfg.seed,
                                                         f.selection_fraction)
                task_sizes = sizes_for_task(sizes, len(train.labels), task.name)
                majority = majority_scores, len(train.labels), len(dev.labels)
            else:
                majority = None, 0, 0
            if "majority_class" in f.baselines and majority[0] is not None:
                rows += _baseline_rows("majority_class", task, *majority, scored_split(f), 0.0)
            if task.format == "tsv" and task.labels is not None:
                rows += _subset_baseline_rows(ctx, f, task, data_dir, scored_split(f), task_sizes)
            if task.format == "seq2seq" and "lead_n" in f.baselines:
                rows += _lead_n_rows(task, data_dir, f, ctx.cfg.seed, scored_split(f))
    # each pretrained kind's rows name the kind that is its control in this run: the report cannot tell from the rows
    # whether a random twin is also the control
    controls = controls_in_run(ctx.cfg, finetune_kinds(ctx.cfg, f))
    results = [{**row, "control": controls[row["model"]]} if row["model"] in controls else row
               for row in _aggregate(rows)]
    write_json_atomically(ctx.out_dir / "results.json", results)
    return {"results": headline_results(results)}


def _baseline_rows(model: str, task: DictConfig, scores: dict[str, float], train_examples: int, dev_examples: int,
                   scored_on: str, seconds: float) -> list[dict]:
    return [{"model": model, "task": task.name, "metric": metric, "score": value, "seed": None, "train_size": None,
             "train_examples": train_examples, "dev_examples": dev_examples, "scored_on": scored_on,
             "seconds": seconds} for metric, value in scores.items()]


def _lead_n_rows(task: DictConfig, data_dir, f: FinetuneConfig, seed: int, scored_on: str) -> list[dict]:
    """The lead-N baseline of a generation task (baselines.lead_n_scores), N chosen on the whole train split."""
    train, dev, _ = tsv_splits(task, data_dir, f.max_train_examples, seed, f.selection_fraction)
    started = time.perf_counter()
    n, scores = lead_n_scores(task, train, dev)
    print(f"finetune {task.name}/lead_n: the first {n} words (chosen on train); "
          + ", ".join(f"{m} {v:.4f}" for m, v in scores.items()), flush=True)
    # what copying the source writes: the distinct share a model's outputs are set beside in the report
    summary = {"output_summary": output_summary([lead(source, n) for source in dev.texts_a])}
    return [{**row, **summary} for row in _baseline_rows("lead_n", task, scores, len(train.labels), len(dev.labels),
                                                          scored_on, round(time.perf_counter() - started, 1))]


def _subset(split: TaskSplit, indices: np.ndarray) -> TaskSplit:
    return TaskSplit([split.texts_a[i] for i in indices], None if split.texts_b is None else
                     [split.texts_b[i] for i in indices], [split.labels[i] for i in indices])


def _subset_baseline_rows(ctx: StageContext, f: FinetuneConfig, task: DictConfig, data_dir, scored_on: str,
                          sizes: list[int | None]) -> list[dict]:
    """finetune.baselines' SUBSET_BASELINES on the labelled subsets the model kinds get, at every size and seed, each
    kept in finished/ like a fine-tuning run (bow_logreg takes minutes on MNLI or QQP). `sizes`: the task's, as
    sizes_for_task gives them (a size of at least the train split is "all", fitted once)."""
    train, dev, _ = tsv_splits(task, data_dir, f.max_train_examples, ctx.cfg.seed, f.selection_fraction)
    rows = []
    for name in (b for b in f.baselines if b in SUBSET_BASELINES):
        scorer = None
        coverage = w2v_mean_coverage(task.name, train, dev, load_word2vec(ctx.stage_dir(WORD2VEC.name)),
                                     f.w2v_min_coverage, chinese_words_of(ctx.cfg)) if name == "w2v_mean" else {}
        for size in sizes:
            for seed in f.seeds:
                tag = f"{task.name}/{name}/{'all' if size is None else size}/seed{seed}"
                done = finished_file(ctx, tag)
                if done.is_file():
                    rows += json.loads(done.read_text())
                    continue
                subset = stratified_subsample(train.labels, size, len(train.labels),
                                              np.random.default_rng([seed, size or 0]))
                scorer = scorer or SUBSET_BASELINES[name](ctx)
                started = time.perf_counter()
                scores = scorer(task, _subset(train, subset), dev, seed)
                result = [{"model": name, "task": task.name, "metric": metric, "score": value, "seed": seed,
                           "train_size": size, "train_examples": len(subset), "dev_examples": len(dev.labels),
                           "scored_on": scored_on, "seconds": round(time.perf_counter() - started, 1), **coverage}
                          for metric, value in scores.items()]
                write_json_atomically(done, result)
                rows += result
                print_scores(tag, scores)
    return rows


def _size_order(row: dict) -> float:
    return _size_key(row.get("train_size"))


def headline_results(results: list[dict]) -> list[dict]:
    """The rows of the largest training size (all data when finetune.train_sizes has null) of each model, task and
    metric: the results table; the smaller sizes are the label-efficiency curve, the encoder snapshots the
    pretraining-scaling one."""
    best: dict[tuple, dict] = {}
    for row in (r for r in results if not is_snapshot(r)):
        key = (row["model"], row["task"], row["metric"])
        if key not in best or _size_order(row) > _size_order(best[key]):
            best[key] = row
    return list(best.values())


def label_efficiency(results: list[dict]) -> list[dict]:
    """The rows of a run with several training sizes (none when it had one), smallest size first, with the
    FLAT_BASELINES' rows, each fitted once on all of the data; encoder snapshots are the pretraining-scaling curve's."""
    models = [r for r in results if r["model"] != "majority_class" and not is_snapshot(r)]
    # lead_n's one row at all of the data is no second size beside a run of one smaller size
    if len({r.get("train_size") for r in models if r["model"] not in FLAT_BASELINES}) < 2:
        return []
    return sorted(models, key=_size_order)


def pretraining_scaling(results: list[dict]) -> list[dict]:
    """The rows of a run with encoder snapshots (none without): each kind's at every pretraining step it was
    fine-tuned from, its own row at the last, fewest steps first."""
    if not any(is_snapshot(r) for r in results):
        return []
    return sorted((r for r in results if r.get("pretraining_steps") is not None), key=lambda r: r["pretraining_steps"])


def _finetune_fingerprint(cfg: DictConfig) -> str:
    """The task files, and the files a model kind reads from outside the cache (an external encoder's)."""
    f = finetune_settings(cfg)
    cache_dir = cache_dir_of(cfg)
    parts = [task_data_fingerprint(load_task(name), f.data_dir, cache_dir,
                                   allow_outside=f.allow_files_outside_data_dir) for name in task_names(f.task)]
    parts += [kind.fingerprint(cfg) for kind in finetune_kinds(cfg, f).values()]
    return hashlib.sha256("".join(parts).encode()).hexdigest()


FINETUNE = Stage("finetune", finetune, finetune_upstream,
                 lambda cfg: ("finetune", *one_process_trainer_keys(cfg), "seed"),
                 fingerprint=_finetune_fingerprint, num_cpus=all_cpus)
