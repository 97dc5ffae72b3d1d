"""Data and configs the tests write themselves (a fresh clone has no ../shared), shared by the test modules."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

import pipeline.config  # noqa: F401  registers the config schema: tiny_config also composes in fresh interpreters
from pipeline import CONF_DIR
from pipeline.engine.dag import execute_stage, plan
from pipeline.engine.module import OptimizerSettings
from pipeline.families import FAMILIES
from pipeline.stages import STAGES

SUBJECTS = ["the old man", "a young woman", "the captain", "my brother", "the king", "her mother", "the sailor",
            "a stranger", "the doctor", "our neighbour"]
VERBS = ["saw", "followed", "remembered", "feared", "loved", "answered", "watched", "called", "found", "left"]
OBJECTS = ["the ship", "a letter", "the garden", "his friend", "the river", "a small house", "the long road",
           "the dark forest", "an old song", "the city"]
ENDINGS = ["at night", "in the morning", "without a word", "before the storm", "after dinner", "once again",
           "with great care", "near the sea"]


def start_session_ray() -> None:
    """The local Ray that the tests of one pytest session share (the ray_session fixture; restarted by a test that had
    to leave it, tests/engine/test_multinode.py), started as a run starts its own, without its workers' output."""
    from pipeline.runner import start_local_ray

    start_local_ray(num_cpus=2, log_to_driver=False)


def write_books(root: Path, n_books: int = 6, paragraphs: int = 12, seed: int = 0) -> Path:
    """Small books of grammatical sentences, hard-wrapped like Gutenberg text, one file per book."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for b in range(n_books):
        paras = []
        for _ in range(paragraphs):
            sentences = [f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                         f"{rng.choice(ENDINGS)}." for _ in range(rng.randint(3, 6))]
            text = " ".join(sentences)
            words, lines, line = text.split(), [], []
            for w in words:  # hard-wrap at ~60 columns
                if sum(len(x) + 1 for x in line) + len(w) > 60:
                    lines.append(" ".join(line))
                    line = []
                line.append(w)
            lines.append(" ".join(line))
            paras.append("\n".join(lines))
        (root / f"book_{b:02d}.txt").write_text(f"Book {b}\n\n" + "\n\n".join(paras) + "\n")
    return root


POSITIVE = ["good", "great", "wonderful", "moving", "funny", "brilliant"]
NEGATIVE = ["bad", "awful", "boring", "dull", "clumsy", "terrible"]


def write_sentiment_task(root: Path, n_train: int = 160, n_dev: int = 40, seed: int = 0) -> Path:
    """GLUE SST-2 layout: sentence<TAB>label, label 1 iff the sentence uses a positive word."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randint(0, 1)
            word = rng.choice(POSITIVE if label else NEGATIVE)
            rows.append(f"{rng.choice(SUBJECTS)} found {rng.choice(OBJECTS)} {word}\t{label}")
        (root / name).write_text("\n".join(rows) + "\n")
    return root


def write_stsb(root: Path) -> None:
    """STS-B layout: a float similarity score for a sentence pair."""
    rng = random.Random(1)
    root.mkdir(parents=True)
    for name, n in (("train.tsv", 40), ("dev.tsv", 12)):
        rows = ["index\tsentence1\tsentence2\tscore"]
        for i in range(n):
            rows.append(f"{i}\t{rng.choice(SUBJECTS)} {rng.choice(POSITIVE)}\t{rng.choice(SUBJECTS)}"
                        f"\t{rng.uniform(0, 5):.2f}")
        (root / name).write_text("\n".join(rows) + "\n")


# Overrides that shrink bert_tiny to seconds: tiny corpus, small vocab, a few steps.
TINY_OVERRIDES = [
    "tokenizer.vocab_size=300", "tokenizer.min_frequency=1", "data.shard_bytes=4000", "data.min_tokens=2",
    "examples.max_seq_length=32", "pretrain.max_steps=30", "pretrain.batch_size=8", "pretrain.warmup_steps=3",
    "pretrain.val_every_steps=15", "pretrain.val_fraction=0.1", "pretrain.lr=2e-3",
    "finetune.task=sst2", "finetune.epochs=1", "finetune.batch_size=16", "finetune.max_seq_length=16",
    "finetune.seeds=[1]", "finetune.train_sizes=[null]", "finetune.min_steps=0",
    "trainer.precision=32-true",
    # bert_tiny's word2vec-started, frozen embeddings (a piece_vectors stage) have tests of their own
    # (test_piece_vectors.py, test_finetuning.py)
    "pretrain.init_embeddings=random", "pretrain.freeze_embeddings=none", "finetune.freeze_embeddings=none",
]


RESUME_OVERRIDES = ["++pretrain.checkpoint_every_steps=10"]  # a tiny run's 30 steps leave checkpoints to resume from


@dataclass(frozen=True)
class TinyFamily:
    """A family's pretraining shrunk to seconds on the tiny corpus (its record's Family.tiny): its experiment, first
    pretraining stage, the stages that one needs and the family's own overrides."""
    experiment: str
    pretraining_stage: str
    data_stages: tuple[str, ...]  # what the pretraining stage needs, in order
    overrides: tuple[str, ...] = ()


TINY_FAMILIES = {family.name: TinyFamily(family.tiny.experiment, family.pretraining_stages[0],
                                         family.tiny.data_stages, family.tiny.overrides)
                 for family in FAMILIES if family.tiny}


def family_config(tmp_path: Path, family: str, extra: list[str] | None = None):
    tiny = TINY_FAMILIES[family]
    return tiny_config(tmp_path, [*tiny.overrides, *(extra or [])], experiment=tiny.experiment)


# seq2seq_tiny builds seed 001's RNN; seed 000's Transformer at a tiny run's width, for what only it has (BART's
# shape and HF class, its layers' names), with the family's tiny data
SEQ2SEQ_TRANSFORMER = [*(o for o in TINY_FAMILIES["seq2seq"].overrides if not o.startswith("+model.config.")),
                       "model=seq2seq_tiny", "+model.config.d_model=32", "+model.config.d_ff=64"]


def seq2seq_transformer_config(tmp_path: Path, extra: list[str] | None = None):
    return tiny_config(tmp_path, [*SEQ2SEQ_TRANSFORMER, *(extra or [])], experiment="seq2seq_tiny")


def tiny_config(tmp_path: Path, extra: list[str] | None = None, experiment: str = "bert_tiny"):
    corpus, task = tmp_path / "books", tmp_path / "task"
    if not corpus.exists():  # written once: rewriting would change the files' fingerprint, i.e. the data
        write_books(corpus)
    if not task.exists():  # also where a test wrote its own books: prepare decontaminates against the task's dev
        write_sentiment_task(task)
    # SentEval's files under tmp_path too (where a test writes its own: write_mr), not at the default data root,
    # $TEXTREP_SHARED_DATA, which tests/conftest.py sets for fast tests alone: prepare's key covers the files (it
    # decontaminates against them), so a tiny run shared by fast and slow tests (family_data) had other keys in each,
    # and a slow test's stage found no upstream output under its own ("seq2seq_tokenizer/<hash>/... does not exist")
    overrides = [f"+experiment={experiment}", f"data.corpus_dir={corpus}", f"finetune.data_dir={task}",
                 f"senteval.data_root={tmp_path / 'senteval'}", f"paths.cache_dir={tmp_path / 'cache'}",
                 f"paths.run_dir={tmp_path / 'run'}", "logger=csv", *TINY_OVERRIDES, *(extra or [])]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def optimizer_settings(lr: float, warmup_steps: int, max_steps: int, **others) -> OptimizerSettings:
    """A pretraining module's optimizer settings for a test that builds the module itself: AdamW without weight decay
    and a linear decay unless `others` say otherwise."""
    return OptimizerSettings(**{"block": "pretrain", "optimizer": "adamw", "weight_decay": 0.0, "betas": (0.9, 0.999),
                                "lr_decay": "linear", **others}, lr=lr, warmup_steps=warmup_steps, max_steps=max_steps)


class TinyRun:
    """The planned stages of a tiny run; `run_stage` executes one exactly as the engine does, in-process."""

    def __init__(self, cfg):
        self.cfg, self.plan = cfg, plan(cfg, STAGES)

    def stage_dir(self, name: str) -> Path:
        return self.plan.dirs[name]

    def run_stage(self, name: str) -> dict:
        inputs = {u: (self.plan.dirs[u], self.plan.hashes[u]) for u in self.plan.stages[name].upstream}
        return execute_stage(self.plan.stages, self.cfg, name, self.plan.hashes[name], self.plan.dirs[name], inputs,
                             Path(self.cfg.paths.run_dir), planned_inputs=self.plan.input_files[name])


# The evaluate stage on write_mr's MR alone (at <senteval.data_root>/MR, tiny_config's <tmp_path>/senteval/MR),
# 3-fold: seconds per encoder.
SENTEVAL_MR_ONLY = ["~senteval.tasks.SICKEntailment", "~senteval.tasks.SICKRelatedness", "~senteval.tasks.MRPC",
                    "senteval.tasks.MR.path=MR", "senteval.classifier.cv_folds=3", "senteval.classifier.inner_folds=2"]


def file_bytes(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (its path relative to it) -> its bytes: two outputs compared exactly."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def write_mr(root: Path) -> Path:
    """The MR layout (rt-polarity.pos / .neg, one sentence per line), with a learnable polarity."""
    root.mkdir(parents=True)
    for name, words in (("rt-polarity.pos", POSITIVE), ("rt-polarity.neg", NEGATIVE)):
        (root / name).write_text("\n".join(f"{s} was {w}" for s in SUBJECTS for w in words[:3]) + "\n")
    return root


def successor_corpus(rng, n: int, vocab: int) -> list[dict]:
    """Pretraining rows of 14 tokens (ids 5..vocab-1; rng a numpy Generator) in which each token is its left
    neighbour + 1, wrapping around: unigram-uniform, yet fully predictable from a neighbour, so only a model that
    learned to use context (and positions) gets far below the unigram baseline."""
    rows = []
    for _ in range(n):
        start = int(rng.integers(0, vocab - 5))
        ids = [2, *((start + np.arange(14)) % (vocab - 5) + 5), 3]  # [CLS] ... [SEP]
        rows.append({"input_ids": np.array(ids), "token_type_ids": np.zeros(len(ids), dtype=int),
                     "next_sentence_label": int(rng.integers(0, 2))})
    return rows


def check_control_start(control: dict, twin: dict, pretrained: dict, words: str, known, layer: str,
                        head: list[str] | None):
    """A control's weights (state dicts of one seed): the pretrained kind's piece vectors in the rows the corpus
    shows (`known`, one bool a piece) and the twin's fresh draws everywhere else, including `layer`, where the
    pretrained kind has its pretraining steps; the task `head` as the pretrained kind's (None: a model that writes
    through its tied output layer has no head of its own)."""
    import torch

    pieces = len(known)
    assert torch.equal(control[words][:pieces][known], pretrained[words][:pieces][known])
    assert not torch.equal(control[words][:pieces][known], twin[words][:pieces][known])
    # a piece the corpus never shows, and the rows past the pieces, keep their fresh initialisation
    assert torch.equal(control[words][:pieces][~known], twin[words][:pieces][~known])
    assert torch.equal(control[words][pieces:], twin[words][pieces:])
    assert control.keys() == twin.keys() == pretrained.keys()
    assert all(torch.equal(control[name], twin[name]) for name in control if name != words)
    assert not torch.equal(control[layer], pretrained[layer])  # no pretraining step
    assert head is None or head and all(torch.equal(control[name], pretrained[name]) for name in head)


class FinetuneStarts:
    """`run`'s fine-tune model kinds, their `upstream` stages run, on its first scored task as `encoded_by` encodes
    it, each built as finetune_once builds it at a seed: where a control's weights start (check_control_start)."""

    def __init__(self, run: TinyRun, out_dir: Path, upstream: tuple[str, ...], encoded_by: str):
        from pipeline.downstream.finetune import finetune_settings, model_sources, scored_tasks
        from pipeline.downstream.tasks import resolve_task_dir
        from pipeline.engine.dag import StageContext
        from pipeline.engine.settings import cache_dir_of

        self.cfg, self.settings = run.cfg, finetune_settings(run.cfg)
        ctx = StageContext(self.cfg, "finetune", out_dir, {name: run.stage_dir(name) for name in upstream})
        self.sources = {kind: models for kind, (models, _) in model_sources(ctx, self.settings).items()}
        self.task = scored_tasks(self.cfg, self.settings)[0]
        self.task_dir = resolve_task_dir(self.task, self.settings.data_dir, cache_dir_of(self.cfg))
        self.data = self.encode(encoded_by)

    def encode(self, kind: str):
        return self.sources[kind].encode(self.task, self.task_dir, self.settings, self.cfg.seed, None)

    def state(self, kind: str, seed: int = 1) -> dict:
        import lightning as L

        L.seed_everything(seed, workers=True, verbose=False)  # as finetune_once seeds each (kind, seed)
        return self.sources[kind].build(self.data).state_dict()


def pieces_known(piece_vectors_dir: Path):
    """Which token ids have a piece vector in a piece-vector stage's output, as a bool tensor (check_control_start's
    `known`)."""
    import torch

    from conventions.piece_vectors import pieces_with_vectors
    from pipeline.piece_vectors import read_piece_vectors

    return torch.from_numpy(pieces_with_vectors(read_piece_vectors(piece_vectors_dir)))
