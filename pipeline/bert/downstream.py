"""BERT fine-tuned end to end on the downstream tasks (Devlin et al. 2019, §4; seed 003): each task encoded with the
model's tokenizer, a task head on the encoder. Four kinds of `finetune.models`: `bert` (this run's encoder, of its
last pretraining phase), `bert_random` (the same architecture untrained: what pretraining must beat; fine-tuned with
`bert` unless finetune.random_twins=false), `bert_w2v` (its control where pretraining starts from the piece vectors:
the same architecture with those vectors as its word embeddings under random layers, no pretraining steps; fine-tuned
with `bert` unless finetune.controls=false) and `bert_external` (`finetune.external_encoder`, an HF BERT directory).
`bert` is also fine-tuned from each encoder snapshot of that phase (pretrain.encoder_snapshots), as `bert@<step>`."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from safetensors.torch import load_file
from torch import nn

from conventions.piece_vectors import pieces_with_vectors
from data_prep.corpus.tokenizer import (
    CLS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    SEP_TOKEN,
    UNK_TOKEN,
    checkpoint_tokenizer,
    encode_batch_ids,
    load_tokenizer,
)
from data_prep.tasks.conll import encode_tagged_sentences
from data_prep.tasks.squad import read_squad, squad_features
from models.bert import (
    BertForPromptClassification,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from models.hf.bert import load_ours_or_hf
from pipeline.bert.data import EncodedPromptTask, EncodedTask, pad_classification_batch
from pipeline.bert.pretrain import (
    HEADS_FILE,
    PHASES,
    encoder_stage,
    pretraining_starts_from_piece_vectors,
    scratch_encoder_config,
)
from pipeline.bert.settings import BertFinetuneConfig
from pipeline.downstream.modules import (
    ClassificationModule,
    QuestionAnsweringModule,
    RegressionModule,
    TokenClassificationModule,
    collate_question_answering,
    collate_token_classification,
)
from pipeline.downstream.settings import FinetuneConfig, finetune_settings
from pipeline.downstream.task_data import TaskData, conll_splits, majority_tag_scores, subsample, tsv_splits
from pipeline.downstream.tasks import load_task, task_names
from pipeline.engine.dag import StageContext
from pipeline.engine.family import FinetuneKind, TokenCoverage
from pipeline.engine.fingerprints import files_fingerprint
from pipeline.engine.pretraining import start_word_embeddings
from pipeline.engine.settings import cache_dir_of, typed_settings
from pipeline.piece_vectors import PieceVectorStart, read_piece_vectors


@dataclass
class BertTaskModels:
    """An encoder directory and its tokenizer; `pretrained`: start from the encoder's weights, else from a fresh
    initialisation of its architecture; `piece_vector_start`: instead of a directory, start where pretraining does
    (`encoder_dir` None, `pretrained` false); `dropout`: the fine-tuned model's dropout rate (finetune.dropout), None to
    keep the encoder's; `pooling`: what a sentence classifier reads (finetune.pooling); `pieces_with_vectors`: where
    the word embeddings start from the piece vectors (the control, or an encoder whose pretraining started there),
    which token ids have one."""
    encoder_dir: Path | None
    tokenizer: object
    encoding_key: str
    pretrained: bool = True
    dropout: float | None = None
    pooling: str = "cls"
    piece_vector_start: PieceVectorStart | None = None
    pieces_with_vectors: np.ndarray | None = None

    def token_coverage(self, data: TaskData) -> TokenCoverage:
        """Of the task's tokens as the model reads them (train and dev, cut to finetune.max_seq_length, a prompt's
        template included, [CLS], [SEP], [PAD] and [MASK] left out), the share that is [UNK] and, where the word
        embeddings start from the piece vectors, the share that has one: a piece without one keeps its random
        initialisation (start_word_embeddings), frozen where pretraining froze the embeddings."""
        ids = np.concatenate([np.zeros(0, dtype=np.int64),
                              *(_input_ids(split[i]) for split in (data.train, data.dev) for i in range(len(split)))])
        ids = ids[~np.isin(ids, [self.tokenizer.token_to_id(t) for t in (PAD_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)])]
        unknown_rate = float(np.mean(ids == self.tokenizer.token_to_id(UNK_TOKEN))) if len(ids) else 0.0
        if self.pieces_with_vectors is None:
            return TokenCoverage(UNK_TOKEN, unknown_rate)
        covered = float(np.mean(self.pieces_with_vectors[ids])) if len(ids) else 0.0
        return TokenCoverage(UNK_TOKEN, unknown_rate, "piece vectors", covered)

    def encode(self, task: DictConfig, data_dir: Path, finetune: FinetuneConfig, seed: int,
               selection_fraction: float | None) -> TaskData:
        return load_task_data(task, data_dir, self.tokenizer, finetune.max_seq_length, finetune.max_train_examples,
                              seed, selection_fraction, self.pooling)

    def build(self, data: TaskData) -> nn.Module:
        start = self.piece_vector_start
        # Reading an encoder builds one, which draws from the seed's random stream before the model is built; the
        # control draws one of its architecture in that place, so that its head and layers are bert_random's at the
        # same seed (and its head bert's): the kinds of a seed differ by where their encoder starts alone.
        encoder = load_ours_or_hf(self.encoder_dir) if start is None else BertModel(start.config)
        config = encoder.config
        if self.dropout is not None:
            config = replace(config, hidden_dropout_prob=self.dropout, attention_probs_dropout_prob=self.dropout)
        model = data.make_model(config)
        if start is not None:
            start_word_embeddings(model.encoder.embeddings.word_embeddings, start.vectors)
        elif self.pretrained:
            model.encoder.load_state_dict(encoder.state_dict())
            if isinstance(model, BertForPromptClassification):
                model.load_prediction_head(load_file(str(self._heads_file())))
        return model

    def _heads_file(self) -> Path:
        """The masked-LM head beside a pretraining stage's encoder (or snapshot's): what a prompt classifier reads."""
        heads = self.encoder_dir.parent / HEADS_FILE
        if not heads.is_file():
            raise FileNotFoundError(f"finetune.pooling=prompt reads the masked-LM head of the encoder's pretraining, "
                                    f"and {self.encoder_dir} has none beside it ({heads}); fine-tune this encoder "
                                    "with finetune.pooling=mean or cls")
        return heads


def _input_ids(item) -> np.ndarray:
    """The token ids of one encoded example of load_task_data's: a sentence (pair), a tagged sentence, or a SQuAD
    window (kept as (index, features))."""
    return np.asarray((item[1] if isinstance(item, tuple) else item)["input_ids"], dtype=np.int64)


def _this_run(pretrained: bool):
    def load(ctx: StageContext) -> BertTaskModels:
        tokenizer_dir = ctx.stage_dir("bert_tokenizer")
        f = typed_settings(ctx.cfg.finetune, BertFinetuneConfig)  # BERT's keys of the block
        vectors = (pieces_with_vectors(read_piece_vectors(ctx.stage_dir("bert_piece_vectors")))
                   if pretrained and pretraining_starts_from_piece_vectors(ctx.cfg) else None)
        return BertTaskModels(ctx.stage_dir(encoder_stage(ctx.cfg)) / "encoder", load_tokenizer(tokenizer_dir),
                              str(tokenizer_dir), pretrained, f.dropout, str(f.pooling), pieces_with_vectors=vectors)
    return load


# `bert`'s control (FinetuneKind.control) where its pretraining starts from the piece vectors
CONTROL = "bert_w2v"


def _control(ctx: StageContext) -> BertTaskModels:
    """bert_w2v: the start of this run's pretraining without its steps, with the tokenizer `bert` reads."""
    tokenizer_dir = ctx.stage_dir("bert_tokenizer")
    tokenizer = load_tokenizer(tokenizer_dir)
    f = typed_settings(ctx.cfg.finetune, BertFinetuneConfig)
    start = PieceVectorStart(scratch_encoder_config(ctx.cfg, tokenizer.get_vocab_size()),
                             read_piece_vectors(ctx.stage_dir("bert_piece_vectors")))
    return BertTaskModels(None, tokenizer, str(tokenizer_dir), pretrained=False, dropout=f.dropout,
                          pooling=str(f.pooling), piece_vector_start=start,
                          pieces_with_vectors=pieces_with_vectors(start.vectors))


def _control_of_bert(cfg: DictConfig) -> str | None:
    """`bert`'s control (FinetuneKind.control): bert_w2v where its pretraining starts from the piece vectors, the random
    twin where it starts from random initialisation, none where it continues pretrain.init_from's checkpoint."""
    if pretraining_starts_from_piece_vectors(cfg):
        return CONTROL
    return None if PHASES[0].settings(cfg).init_from else "bert_random"


def _external(ctx: StageContext) -> BertTaskModels:
    f = typed_settings(ctx.cfg.finetune, BertFinetuneConfig)
    if not f.external_encoder:
        raise ValueError("finetune.models has bert_external but finetune.external_encoder is not set; pass the "
                         "directory of an HF BERT (config.json, weights and tokenizer files)")
    path = Path(f.external_encoder).expanduser()
    return BertTaskModels(path, external_tokenizer(path), str(path), dropout=f.dropout, pooling=str(f.pooling))


def _external_files(cfg: DictConfig) -> str:
    path = typed_settings(cfg.finetune, BertFinetuneConfig).external_encoder
    return files_fingerprint(Path(path).expanduser(), "*", cache_dir_of(cfg)) if path else ""


def _this_run_stages(cfg: DictConfig) -> tuple[str, ...]:
    return "bert_tokenizer", encoder_stage(cfg)


def _pretrained_stages(cfg: DictConfig) -> tuple[str, ...]:
    """`bert`'s: with the piece vectors its pretraining started from, whose coverage of a task its rows report."""
    return _this_run_stages(cfg) + (("bert_piece_vectors",) if pretraining_starts_from_piece_vectors(cfg) else ())


FINETUNE_KINDS = {"bert": FinetuneKind(_pretrained_stages, _this_run(pretrained=True), pretraining_stage=encoder_stage,
                                       random_twin="bert_random", control=_control_of_bert),
                  "bert_random": FinetuneKind(_this_run_stages, _this_run(pretrained=False)),
                  # what it reads leaves pretraining out: the control waits for no pretraining step
                  CONTROL: FinetuneKind(lambda cfg: ("bert_tokenizer", "bert_piece_vectors"), _control,
                                        control_of="bert"),
                  "bert_external": FinetuneKind(lambda cfg: (), _external, fingerprint=_external_files)}


def task_prompt(task: DictConfig) -> tuple[str, list[str]]:
    """A task's prompt from its YAML: prompt_template (with {text} and [MASK], e.g. "a [MASK] film . {text}") and
    prompt_label_words, one per label in the order of `labels`; refused for a task that cannot have one."""
    if task.get("text_b"):
        raise ValueError(f"task {task.name}: finetune.pooling=prompt classifies single sentences, and this task has "
                         "sentence pairs; use finetune.pooling=mean or cls")
    words = list(task.get("prompt_label_words") or [])
    if task.labels is None or not task.get("prompt_template") or len(words) != len(task.labels):
        raise ValueError(f"task {task.name}: finetune.pooling=prompt needs prompt_template (with {{text}} and [MASK]) "
                         f"and prompt_label_words, one word per label of {list(task.labels or [])}, in its YAML "
                         "(tasks/rotten_tomatoes.yaml has both)")
    return str(task.prompt_template), words


def prompt_of(task: DictConfig, tok) -> tuple[str, list[int]]:
    """A task's prompt template and its label words' ids, each one piece of the tokenizer's vocabulary."""
    template, words = task_prompt(task)
    ids, unk = encode_batch_ids(tok, words), tok.token_to_id("[UNK]")
    split = [word for word, word_ids in zip(words, ids) if len(word_ids) != 1 or word_ids[0] == unk]
    if split:
        raise ValueError(f"task {task.name}: prompt_label_words {split} are not one piece of the tokenizer's "
                         "vocabulary, so the [MASK] has no single score for them; choose words that are")
    return template, [word_ids[0] for word_ids in ids]


def check_prompts(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: with finetune.pooling=prompt, every task the BERT rows fine-tune on has a prompt (a
    task without one failed only in fine-tuning, after pretraining)."""
    f, bert = finetune_settings(cfg), typed_settings(cfg.finetune, BertFinetuneConfig)
    if "finetune" in stages and bert.pooling == "prompt" and any(str(m) in FINETUNE_KINDS for m in f.models):
        for name in task_names(f.task):
            task_prompt(load_task(name))


def load_task_data(task: DictConfig, data_dir: Path, tok, max_seq_length: int, max_train_examples: int | None,
                   seed: int, selection_fraction: float | None = None, pooling: str = "cls") -> TaskData:
    """Read and encode one task, dispatching on its `format` (tsv | conll | squad) and label type; sentence
    (pair) tasks classify from `pooling` ("cls" or "mean", models.bert.BertForSequenceClassification; "prompt", the
    masked-LM head in the task's template, BertForPromptClassification)."""
    if task.format == "tsv":
        train, dev, majority_scores = tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
        if pooling == "prompt":
            template, word_ids = prompt_of(task, tok)
            sets = [EncodedPromptTask(tok, template, s.texts_a, s.labels, max_seq_length) for s in (train, dev)]
            return TaskData(*sets, pad_classification_batch,
                            lambda c: BertForPromptClassification(c, word_ids, tok.token_to_id("[MASK]")),
                            partial(ClassificationModule, metric=task.metric), majority_scores, train.labels,
                            [len(ids) for ids, _ in sets[0].rows])
        sets = [EncodedTask(tok, s.texts_a, s.texts_b, s.labels, max_seq_length) for s in (train, dev)]
        lengths = [len(ids) for ids, _ in sets[0].rows]
        if task.labels is None:  # regression (STS-B): one output, mean squared error
            return TaskData(*sets, pad_classification_batch,
                            lambda c: BertForSequenceClassification(c, 1, pooling=pooling),
                            RegressionModule, None, train_lengths=lengths)
        return TaskData(*sets, pad_classification_batch,
                        lambda c: BertForSequenceClassification(c, len(task.labels), pooling=pooling),
                        partial(ClassificationModule, metric=task.metric), majority_scores, train.labels, lengths)
    if task.format == "conll":
        train, dev = conll_splits(task, data_dir, max_train_examples, seed, selection_fraction)
        labels = list(task.labels)
        train_features = encode_tagged_sentences(tok, train, labels, max_seq_length)
        return TaskData(train_features, encode_tagged_sentences(tok, dev, labels, max_seq_length),
                        collate_token_classification, lambda c: BertForTokenClassification(c, len(labels)),
                        partial(TokenClassificationModule, labels=labels, dev_tags=[s.tags for s in dev],
                                metric=task.metric), majority_tag_scores(task, train, dev),
                        train_lengths=[len(feature["input_ids"]) for feature in train_features])
    if task.format == "squad":
        train = subsample(read_squad(data_dir / task.train_file), max_train_examples, seed)
        dev = read_squad(data_dir / task.dev_file)
        windows = dict(max_seq_length=max_seq_length, doc_stride=task.doc_stride,
                       max_query_length=task.max_query_length)
        dev_features = squad_features(tok, dev, **windows)
        return TaskData(list(enumerate(squad_features(tok, train, **windows))), list(enumerate(dev_features)),
                        collate_question_answering, BertForQuestionAnswering,
                        partial(QuestionAnsweringModule, dev_examples=dev, dev_features=dev_features,
                                n_best_size=task.n_best_size, max_answer_length=task.max_answer_length), None)
    raise ValueError(f"task {task.name}: unknown format {task.format!r}; use tsv, conll or squad")


def external_tokenizer(path: Path):
    """The tokenizer saved beside an external encoder (HF `tokenizer.json`, or a BERT `vocab.txt`)."""
    try:
        return checkpoint_tokenizer(path)[0]
    except FileNotFoundError as err:
        raise FileNotFoundError(f"finetune.external_encoder={path}: {err}") from None
