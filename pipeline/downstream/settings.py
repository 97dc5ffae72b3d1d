"""The `finetune` block's schema (FinetuneConfig) and its typed reading, apart from the stage
(pipeline/downstream/finetune.py): every family's downstream.py reads these settings, and the stage reads the
families' kinds, so the schema imports neither the registry nor torch (prepare's workers read the block's tasks too)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from omegaconf import DictConfig

from pipeline.downstream.tasks import SCORE_SPLITS
from pipeline.engine.settings import COUNT, FRACTION, POSITIVE_INT, RATE, Number, ranged, typed_settings
from pipeline.schema import FreezeEmbeddings

# finetune.baselines: majority_class is scored once, from all of train, as is lead_n (generation tasks); bow_logreg
# and w2v_mean on the model kinds' labelled subsets (pipeline/downstream/finetune.py SUBSET_BASELINES)
BASELINES = ("majority_class", "bow_logreg", "w2v_mean", "lead_n")

Baseline = StrEnum("Baseline", {name: name for name in BASELINES}, module=__name__)
ScoreSplit = StrEnum("ScoreSplit", {name: name for name in SCORE_SPLITS}, module=__name__)


@dataclass
class FinetuneConfig:
    # a name in tasks/, or a list of names: [cola, sst2, mrpc, stsb, rte, wnli]; checked against tasks/ at start-up
    task: Any = "rotten_tomatoes"
    # null: the task's built-in data; else its directory, or a root holding each task's data_subdir
    data_dir: Optional[str] = None
    # and/or bert_external: an HF BERT directory; elmo (elmo_random): this run's frozen biLM (its random twin) + head;
    # skip_thought, skip_thought_combine, ... (as evaluate.encoders names them): a linear model on frozen vectors.
    # The names are the families' kinds (Family.finetune_kinds): pipeline/config.py narrows the field to them where
    # it builds the root schema, so a name no family offers fails at composition, naming the key, while this module
    # imports no registry (every family's downstream.py imports it).
    models: list[str] = field(default_factory=lambda: ["bert", "bert_random"])
    # Each pretrained kind in `models` is also fine-tuned from random initialisation (its twin: bert_random,
    # elmo_random, gpt_random, ...), listed or not: the gain over the same architecture untrained is what says whether
    # pretraining paid (Wieting & Kiela 2019), and the report states it. false: only the kinds listed.
    random_twins: bool = True
    # And beside it its control where the run has one (FinetuneKind.control; bert_w2v for a BERT pretrained from the
    # piece vectors): the same start without the pretraining steps, by the same recipe, listed or not. A start of
    # word vectors can carry most of what the pretrained kind gains over its random twin, so only the gain over the
    # control says what pretraining itself bought; the report states both. false: no control that is not listed.
    controls: bool = True
    # Rows fitted beside the models (TSV classification tasks): majority_class, once; bow_logreg (TF-IDF uni+bigrams)
    # and w2v_mean (word2vec trained on this run's pretraining corpus, the `word2vec` block) with a logistic
    # regression, on the same labelled subsets as the models, at every train size and seed: a pretrained encoder
    # should beat w2v_mean, what a minute of word2vec on the same text gives (docs/pretraining_recipes.md)
    baselines: list[Baseline] = field(default_factory=lambda: [
        Baseline.majority_class, Baseline.bow_logreg, Baseline.w2v_mean])
    # w2v_mean's rows carry its coverage, the share of the task's words that word2vec kept a vector of. Below half,
    # most sentences are the mean of a minority of their words, or zeros (a corpus of rare words left word2vec the
    # vocabulary ['.'], and w2v_mean scored 0.5 on zero features): the row then measures what the corpus shares with
    # the task, not word2vec, and the stage and the report say so beside it. The same bound holds for a model kind
    # whose word embeddings start from word2vec vectors of its tokens, skip-gram on the same corpus
    # (TaskModels.token_coverage): the task's tokens without one start from random rows, frozen where the embeddings
    # are, so below it the row measures what the corpus shares with the task more than that start.
    w2v_min_coverage: float = ranged(0.5, FRACTION)
    # Above this share of a task's tokens unknown to a model kind's tokenizer, the stage warns and the report marks
    # the kind's rows. A subword vocabulary spells every word of its alphabet, so its unknown tokens are characters it
    # never saw: one token in twenty (an unknown word in most sentences) says the tokenizer does not cover the task's
    # script or register, where its own corpus warns at 0.5 % (data_prep.corpus.tokenizer).
    max_unknown_rate: float = ranged(0.05, FRACTION)
    # one run per seed (head init, data order, subset drawn) -> mean ± std in the results table
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    # Labelled training examples per run, drawn per seed and stratified by label from the (capped) train split; null =
    # all. Several sizes draw the label-efficiency curve (label_efficiency.png), where pretraining's value shows most.
    train_sizes: list[Optional[int]] = field(default_factory=lambda: [None])
    # at least this many optimizer steps per run (epochs raised): small train sizes need them
    min_steps: int = ranged(0, COUNT)
    max_seq_length: int = ranged(64, POSITIVE_INT)
    batch_size: int = ranged(32, POSITIVE_INT)
    # Batches of sentences of similar length (pipeline/downstream/task_data.py): a batch pads to its longest sentence.
    # Rotten Tomatoes' sentences average 31 tokens, while random batches of 32 pad to 59; grouped, to 33. bert_tiny's
    # matmuls already skip the padding, its attention does not: its fine-tune stage ran 1.05x as fast, with accuracy
    # unchanged within the seeds' spread (selection split, docs/history/pretraining_recipes_log.md,
    # "Batches of similar length")
    group_by_length: bool = True
    eval_batch_size: int = ranged(128, POSITIVE_INT)
    # docs/pretraining_recipes.md, chosen on a held-out tenth of the train split: at BERT-base's 1e-4 for 2 epochs a
    # 2-layer encoder underfits (0.69-0.71 accuracy on Rotten Tomatoes, 0.57 with 1,000 examples)
    lr: float = ranged(1e-3, RATE)
    # the encoder trains at this x lr, the fresh task head at lr (Howard & Ruder 2018)
    encoder_lr_factor: float = ranged(1.0, RATE)
    # and each encoder layer at this x the rate of the layer above (ELECTRA's 0.8); both for pretrained encoders
    # only: a random twin trains every layer at lr
    layer_lr_decay: float = ranged(1.0, Number(float, 0, 1, low_open=True))
    # which rows of the encoder's word embeddings stay as pretraining left them: all, with_vector (those started from a
    # piece vector; the others train) or none (pipeline/schema.py FREEZE_EMBEDDINGS); twins train every row
    freeze_embeddings: FreezeEmbeddings = FreezeEmbeddings.none
    # epochs of the task head alone on the frozen encoder before fine-tuning all of it (LP-FT, Kumar et al. 2022);
    # 0: none
    linear_probe_epochs: int = ranged(0, COUNT)
    epochs: int = ranged(3, POSITIVE_INT)
    warmup_fraction: float = ranged(0.1, FRACTION)
    weight_decay: float = 0.01
    max_train_examples: Optional[int] = ranged(None, Number(int, 1, nullable=True))  # cap for quick runs; null = all
    # For choosing fine-tuning settings honestly: score on this fraction of the train split, held out (and not
    # trained on), instead of the dev split that the results report. null: train on train, score on dev.
    selection_fraction: Optional[float] = ranged(None, Number(float, 0, 1, low_open=True, nullable=True))
    # How many fine-tuning runs train at once, each in a Ray worker of its own with (the stage's CPUs / parallel_runs)
    # torch threads; null: one per CPU the stage is granted (ray.num_cpus) when training on a CPU, one on a GPU. A
    # bert_tiny fine-tuning step on 1 thread is far from twice as slow as on 2 (small matmuls, per-op overhead): two
    # 1-thread runs at once trained 1.32-1.42x the steps per second of one 2-thread run (make bench-finetune, "2 x 1
    # thread"), and the runs are independent. 1: every run in the stage's own process, one after another.
    parallel_runs: Optional[int] = ranged(None, Number(int, 1, nullable=True))
    # The split the results are scored on: dev, or test (tasks with a test_file: bbc_headlines, the zh_* tasks) once
    # every setting has been fixed without it. Not with selection_fraction, which scores the held-out train instead.
    score_split: ScoreSplit = ScoreSplit.dev
    # A task YAML's train_file, dev_file and test_file are read inside data_dir: an absolute or `../` name there reads
    # files that no setting of the run names, which another user's YAML can point anywhere. true reads them where they
    # are (their contents still in the stages' keys).
    allow_files_outside_data_dir: bool = False


def finetune_settings(cfg: DictConfig) -> FinetuneConfig:
    """The `finetune` block as its typed settings, made once where the stage (or a start-up check) begins and passed
    on from there: types and enums as the schema declares them, attributes instead of string keys. The keys a family
    adds to the block (BERT's pooling and dropout) are the family's to read when it loads its models."""
    return typed_settings(cfg.finetune, FinetuneConfig)
