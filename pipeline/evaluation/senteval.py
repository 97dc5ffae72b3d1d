"""SentEval-style evaluation of frozen sentence encoders (Conneau & Kiela 2018, facebookresearch/SentEval; seed 000).

The encoder protocol is SentEval's: an encoder is any object with

    name: str                                            row label in the results table
    prepare(samples: list[list[str]]) -> None            called once per task with every tokenised sentence the
                                                         task will ask for (all splits, both sides of pairs), e.g.
                                                         to build a task vocabulary; may do nothing
    batcher(batch: list[list[str]]) -> np.ndarray        (B, D) float embeddings, row i for sentence batch[i]; D is
                                                         the same for every batch; sentences may be empty lists

Sentences arrive lowercased and tokenised (data_prep.tasks.senteval_data.tokenize). As in SentEval, each distinct
sentence
is embedded once and batches are formed from sentences sorted by length, so a batch needs little padding; the encoder
must therefore return the same vector for a sentence whatever batch it is in (no dropout, no batch statistics).

On top of the frozen features sits only a multinomial logistic regression (SentEval's LogReg, nhid=0), so scores
measure the representation, not the classifier:

    kind              data                              features               protocol                  metrics
    ----------------  --------------------------------  ---------------------  ------------------------  ------------
    mr, cr, subj,     one sentence, a label             u                      stratified 10-fold CV     accuracy
    mpqa, tsv
    trec              TREC train_5500 / TREC_10         u                      L2 by inner CV on train   accuracy
    sick_entailment   SICK TRAIN / TRIAL / TEST         pair features          L2 on TRIAL, test on TEST accuracy
    sick_relatedness  SICK TRAIN / TRIAL / TEST         pair features          Tai et al. 2015 (below)   pearson,
                                                                                                         spearman
    mrpc              GLUE MRPC train / dev             pair features          L2 by inner CV on train   accuracy, f1

The pair features are senteval.pair_features: [abs_diff, product] = [|u-v|, u*v] by default, as Skip-Thought
(Kiros et al. 2015) and SentEval itself feed SICK and MRPC, so scores sit beside seed 000's tables; [u, v, abs_diff,
product] is InferSent's set (Conneau et al. 2017). Each pair-task row names the set it was scored with.
The L2 strength is always chosen on data the reported score never sees: inner stratified k-fold on the training part
(SentEval's InnerKFoldClassifier), or the task's own validation split when it has one (SplitClassifier).

This module is the `senteval` block and the runner over its tasks; the rest, a module each: the task kinds of the
table (task_kinds.py), model selection (model_selection.py), the classifier (softmax_regression.py), relatedness
(relatedness.py), the pair features (pair_features.py), embedding and the GloVe baseline (embedding.py), the
classifier's settings (classifier_settings.py); the data readers (data_prep/tasks/senteval_data.py) and the stage
(pipeline/evaluation/stage.py).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.tasks.senteval_data import LabelledSentences
from pipeline.engine.family import Encoder
from pipeline.engine.fingerprints import files_fingerprint
from pipeline.evaluation.classifier_settings import ClassifierConfig, ClassifierSettings
from pipeline.evaluation.pair_features import PAIR_FEATURES
from pipeline.evaluation.task_kinds import PAIR_KINDS, TASK_KINDS

PairFeature = StrEnum("PairFeature", {name: name for name in PAIR_FEATURES}, module=__name__)


@dataclass
class SentevalConfig:
    """The `senteval` block: SentEval-style evaluation of frozen encoders (Conneau & Kiela 2018). Task paths
    are relative to data_root; an absolute path is used as is. Drop a task with `~senteval.tasks.MR`, add a labelled
    TSV with e.g. +senteval.tasks.SST2='{kind: tsv, path: /data/SST-2/train.tsv, text_column: sentence, label_column:
    label}' (optional `label_names: [...]` fixes the label order; otherwise the sorted distinct labels). The rest of
    SentEval's single-sentence tasks are read from the files as downloaded (data_prep/tasks/senteval_data.py), e.g.
    +senteval.tasks.CR='{kind: cr, path: senteval/CR}', and likewise kind subj (SUBJ), mpqa (MPQA), trec (TREC):
    CR from custrev.{pos,neg} (SentEval) or Hu & Liu 2004's annotated product files (*.txt); SUBJ from
    subj.{objective,subjective} (SentEval) or Cornell's plot.tok.gt9.5000 / quote.tok.gt9.5000; MPQA from
    mpqa.{pos,neg}; TREC from train_5500.label and TREC_10.label (its own train/test split)."""
    data_root: str = "${oc.env:TEXTREP_SHARED_DATA,../shared/data}"
    batch_size: int = 128  # sentences per batcher call (SentEval's default)
    # What the classifier of a sentence-pair task (SICK, MRPC) sees of the two embeddings u and v: [abs_diff,
    # product] = [|u-v|, u*v] as Skip-Thought (Kiros et al. 2015) and SentEval, for comparison with seed 000's
    # tables; InferSent (Conneau et al. 2017) uses [u, v, abs_diff, product].
    pair_features: list[PairFeature] = field(default_factory=lambda: [
        PairFeature(name) for name in ClassifierSettings.pair_features])
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    # name -> {kind, path, ...}, the keys a kind reads (TASK_KINDS)
    tasks: dict[str, Any] = field(default_factory=lambda: {
        "MR": {"kind": "mr", "path": "senteval/MR"},
        "SICKEntailment": {"kind": "sick_entailment", "path": "senteval/SICK/SICK.txt"},
        "SICKRelatedness": {"kind": "sick_relatedness", "path": "senteval/SICK/SICK.txt"},
        "MRPC": {"kind": "mrpc", "path": "glue/MRPC"}})


def task_paths(settings: SentevalConfig) -> dict[str, Path]:
    """Each task's data file or directory (`senteval.tasks.<name>.path` under `senteval.data_root`)."""
    root = Path(settings.data_root).expanduser()
    return {name: root / str(spec["path"]) for name, spec in settings.tasks.items()}


def senteval_files_fingerprint(settings: SentevalConfig, cache_dir: str) -> str:
    """The files of every SentEval task of the `senteval` block; a task without data as `missing`, so that its data
    added later changes the key of the stages that skipped it (the evaluate stage, prepare's decontamination)."""
    return hashlib.sha256("".join(f"missing {path}\0" if not path.exists()
                                  else files_fingerprint(path, "*", cache_dir) if path.is_dir()
                                  else files_fingerprint(path.parent, path.name, cache_dir)
                                  for path in task_paths(settings).values()).encode()).hexdigest()


def tasks_with_data(settings: SentevalConfig, skipped_means: str) -> tuple[SentevalConfig, dict[str, str]]:
    """The `senteval` block less the tasks whose data is not there, and those tasks, name -> the path looked for.
    The probes' data is optional (a fresh clone has no ../shared/data), so a run without it completes, one warning
    per skipped task saying `skipped_means` and how to get it or drop the task."""
    # resolved: a relative data_root is read from the directory the run started in, which the message must not hide
    missing = {name: path.resolve() for name, path in task_paths(settings).items() if not path.exists()}
    for name, path in missing.items():
        relative = settings.tasks[name]["path"]
        get_it = f"put it at {path}" if Path(relative).is_absolute() else \
            f"set TEXTREP_SHARED_DATA (or senteval.data_root) to a directory holding {relative}"
        print(f"WARNING: senteval task {name}: no data at {path}, {skipped_means}. To run it, {get_it}; to do "
              f"without it, drop it (~senteval.tasks.{name}) or leave evaluate out of pipeline.stages", flush=True)
    present = {name: spec for name, spec in settings.tasks.items() if name not in missing}
    return replace(settings, tasks=present), {name: str(path) for name, path in missing.items()}


def evaluation_texts(settings: SentevalConfig) -> dict[str, list[str]]:
    """Per task, the sentences it is scored on: every split but train (SICK's trial and test, MRPC's and TREC's
    test), or all of a task scored by cross-validation (MR, CR, SUBJ, MPQA): what pretraining must not read."""
    texts = {}
    for name, path in task_paths(settings).items():
        spec = settings.tasks[name]
        data = TASK_KINDS[spec["kind"]][0](path, spec)
        splits = [split for split_name, split in data.items() if split_name != "train"] \
            if isinstance(data, dict) else [data]
        texts[name] = [" ".join(tokens) for split in splits
                       for tokens in (split.sentences if isinstance(split, LabelledSentences)
                                      else split.sentences_a + split.sentences_b)]
    return texts


def run_senteval(encoders: list[Encoder], senteval: SentevalConfig, seed: int) -> list[dict]:
    """Evaluate every encoder on every task of the `senteval` block and return rows {encoder, task, metric, score},
    plus the pair_features list on the rows of pair tasks. Each task draws its folds from a generator seeded with
    `seed` alone, so results do not depend on which other tasks or encoders run."""
    settings = ClassifierSettings.from_config(senteval.classifier, senteval.pair_features)
    rows = []
    for task_name, path in task_paths(senteval).items():
        spec = senteval.tasks[task_name]
        if spec["kind"] not in TASK_KINDS:
            raise ValueError(f"senteval task {task_name}: unknown kind {spec['kind']!r}; use one of {list(TASK_KINDS)}")
        read, evaluate = TASK_KINDS[spec["kind"]]
        data = read(path, spec)
        for encoder in encoders:
            start = time.perf_counter()
            metrics = evaluate(encoder, data, settings, senteval.batch_size, np.random.default_rng(seed))
            # printed as the other stages' progress is: a Ray worker's logging stops at WARNING, and an evaluate
            # stage of ten encoders runs for half an hour
            print(f"senteval {encoder.name} on {task_name}: "
                  f"{', '.join(f'{m} {s:.4f}' for m, s in metrics.items())} ({time.perf_counter() - start:.1f} s)",
                  flush=True)
            features = {"pair_features": list(settings.pair_features)} if spec["kind"] in PAIR_KINDS else {}
            rows += [{"encoder": encoder.name, "task": task_name, "metric": metric, "score": round(score, 4),
                      **features} for metric, score in metrics.items()]
    return rows


def results_table(rows: list[dict]) -> list[dict]:
    """One row per encoder with one column per "task metric" (e.g. "MR accuracy"), in the order rows arrive."""
    table: dict[str, dict] = {}
    for row in rows:
        table.setdefault(row["encoder"], {"encoder": row["encoder"]})[f"{row['task']} {row['metric']}"] = row["score"]
    return list(table.values())
