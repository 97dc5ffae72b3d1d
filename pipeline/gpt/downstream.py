"""GPT fine-tuned end to end on the downstream tasks as in GPT-1 (Radford et al. 2018, Sec. 3.2-3.3; seed 004): each
example becomes one token sequence (two for a similarity pair) framed by start, delimiter and extract tokens, a linear
head reads the extract token's final state (or what finetune.gpt_pooling names), and the loss is the task's plus λ x
the LM loss on the same tokens (finetune.lm_loss_weight, GPT-1's 0.5 by default).
Tagging tasks (CoNLL) read each word's tag at its last token and the token after it
(models.gpt.GPTForTokenClassification); generation tasks (bbc_headlines) fine-tune the LM to continue "source TL;DR:"
with the target, as GPT-2 summarised.
`finetune.models=[gpt]`: this run's pretrained GPT, and with it (finetune.random_twins) `gpt_random`, its
architecture untrained, and (finetune.controls) its control where pretraining starts from the piece vectors,
`gpt_w2v`: the same architecture with those vectors as its token embeddings under random layers, no pretraining steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from conventions.piece_vectors import pieces_with_vectors
from data_prep.examples.gpt_blocks import END_OF_TEXT, load_gpt_tokenizer
from data_prep.tasks.conll import TaggedSentence
from models import IGNORE_INDEX
from models.checkpoint import read_config
from models.gpt import GPTForSequenceClassification, GPTForTokenClassification, GPTLMHeadModel, load_pretrained
from pipeline.downstream.generation import GENERATED_DIR, GenerationModule, WritingTaskModels, task_decoding
from pipeline.downstream.modules import (
    ClassificationModule,
    RegressionModule,
    TokenClassificationModule,
    collate_token_classification,
    pad_right,
)
from pipeline.downstream.settings import FinetuneConfig
from pipeline.downstream.task_data import TaskData, conll_splits, majority_tag_scores, tsv_splits
from pipeline.downstream.tasks import scoring_options
from pipeline.engine.dag import StageContext
from pipeline.engine.family import FinetuneKind
from pipeline.engine.pretraining import start_word_embeddings
from pipeline.engine.settings import typed_settings
from pipeline.gpt.pretrain import pretraining_starts_from_piece_vectors, scratch_config
from pipeline.gpt.settings import GptFinetuneConfig
from pipeline.piece_vectors import PieceVectorStart, read_piece_vectors

# GPT-1 Sec. 3.3: similarity has no inherent order, so both orders are encoded and their extract states summed: for
# regression pairs (STS-B) and GPT-1's other similarity tasks, MRPC and QQP.
SIMILARITY_TASKS = ("mrpc", "qqp")


def transform(tokens_a: list[int], tokens_b: list[int] | None, special: tuple[int, int, int], max_len: int,
              both_orders: bool) -> list[list[int]]:
    """GPT-1's input transformations (Figure 1): [start] a [extract], or [start] a [delim] b [extract], and with
    `both_orders` also [start] b [delim] a [extract]. The texts are cut to fit max_len, a pair's longer text first."""
    start, delim, extract = special
    if tokens_b is None:
        return [[start, *tokens_a[: max_len - 2], extract]]
    a, b = list(tokens_a), list(tokens_b)
    while len(a) + len(b) > max_len - 3:
        (a if len(a) >= len(b) else b).pop()
    orders = [(a, b), (b, a)] if both_orders else [(a, b)]
    return [[start, *x, delim, *y, extract] for x, y in orders]


def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Rows {"sequences": K token lists, "label"} -> input_ids (B, K, T) right-padded with 0 (never read: attention is
    causal and the LM loss stops at `last`), last (B, K) the extract token's index, labels."""
    width = max(len(s) for r in rows for s in r["sequences"])
    K = len(rows[0]["sequences"])
    input_ids = torch.zeros(len(rows), K, width, dtype=torch.long)
    last = torch.zeros(len(rows), K, dtype=torch.long)
    for i, r in enumerate(rows):
        for k, sequence in enumerate(r["sequences"]):
            input_ids[i, k, : len(sequence)] = torch.as_tensor(sequence)
            last[i, k] = len(sequence) - 1
    dtype = torch.float32 if isinstance(rows[0]["label"], float) else torch.long
    return {"input_ids": input_ids, "last": last, "labels": torch.tensor([r["label"] for r in rows], dtype=dtype)}


class GPTObjective:
    """GPT-1's fine-tuning loss L3 = L2 (task) + λ L1 (LM on the task's tokens; λ = lm_loss_weight, L2 alone at 0)
    for ClassificationModule's and RegressionModule's dev scoring; `task_loss` is theirs: (logits, labels) -> (loss,
    predictions)."""

    def __init__(self, *args, lm_loss_weight: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.lm_loss_weight = lm_loss_weight

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        logits, lm_loss = self.model(batch["input_ids"], batch["last"], lm_loss=self.lm_loss_weight > 0)
        loss, predictions = self.task_loss(logits, batch["labels"])
        return (loss if lm_loss is None else loss + self.lm_loss_weight * lm_loss), predictions


class GPTClassificationModule(GPTObjective, ClassificationModule):
    @staticmethod
    def task_loss(logits, labels):
        return F.cross_entropy(logits.float(), labels), logits.argmax(-1)


class GPTRegressionModule(GPTObjective, RegressionModule):
    @staticmethod
    def task_loss(logits, labels):
        scores = logits.squeeze(-1)
        return F.mse_loss(scores.float(), labels.float()), scores


def load_task_data(task: DictConfig, data_dir: Path, tokenizer, n_positions: int, max_seq_length: int,
                   max_train_examples: int | None, seed: int, selection_fraction: float | None = None,
                   samples_path: Path | None = None, settings: GptFinetuneConfig = GptFinetuneConfig()) -> TaskData:
    """One TSV task (classification, pair, regression) encoded with GPT-1's input transformations, its head reading
    `settings.gpt_pooling` and trained with `settings.lm_loss_weight` x the LM loss beside the task's (GPTObjective), a
    CoNLL tagging task (tagging_task_data) or a generation task (generation_task_data, its generations written to
    samples_path); make_model takes the pretrained GPTConfig."""
    if task.format == "conll":
        return tagging_task_data(task, data_dir, tokenizer, min(max_seq_length, n_positions), max_train_examples, seed,
                                 selection_fraction)
    if task.format == "seq2seq":
        return generation_task_data(task, data_dir, tokenizer, n_positions, max_seq_length, max_train_examples, seed,
                                    samples_path, selection_fraction)
    if task.format != "tsv":
        raise ValueError(f"task {task.name}: {task.format} tasks are not supported for gpt (its heads here take tsv "
                         "classification, pair and regression tasks, conll tagging and seq2seq generation); drop gpt "
                         "and gpt_random from finetune.models for it")
    train, dev, majority_scores = tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
    vocab_size = tokenizer.get_vocab_size()
    special = (vocab_size, vocab_size + 1, vocab_size + 2)
    max_len = min(max_seq_length, n_positions)
    both = task.labels is None or task.name in SIMILARITY_TASKS

    def rows(split) -> list[dict]:
        ids_a = [e.ids for e in tokenizer.encode_batch(split.texts_a)]
        ids_b = None if split.texts_b is None else [e.ids for e in tokenizer.encode_batch(split.texts_b)]
        return [{"sequences": transform(ids_a[i], None if ids_b is None else ids_b[i], special, max_len, both),
                 "label": split.labels[i]} for i in range(len(split.labels))]

    regression = task.labels is None
    num_labels = 1 if regression else len(task.labels)

    def make_model(config):
        if config.vocab_size != vocab_size:
            raise ValueError(f"the GPT has {config.vocab_size} tokens but its tokenizer.json {vocab_size}; pretrain "
                             "them together (stage gpt_pretrain writes both)")
        return GPTForSequenceClassification(
            type(config)(**{**vars(config), "vocab_size": vocab_size + GPTForSequenceClassification.N_SPECIAL}),
            num_labels, str(settings.gpt_pooling))

    train_rows = rows(train)
    lengths = [max(len(sequence) for sequence in row["sequences"]) for row in train_rows]
    if regression:
        return TaskData(train_rows, rows(dev), collate, make_model,
                        partial(GPTRegressionModule, lm_loss_weight=settings.lm_loss_weight), None,
                        train_lengths=lengths)
    return TaskData(train_rows, rows(dev), collate, make_model,
                    partial(GPTClassificationModule, metric=task.metric, lm_loss_weight=settings.lm_loss_weight),
                    majority_scores, train.labels, lengths)


def tagging_features(tokenizer, sentences: list[TaggedSentence], labels: list[str], max_len: int,
                     end_id: int) -> list[dict]:
    """One feature per sentence, as data_prep.tasks.conll.encode_tagged_sentences makes BERT's: the words' byte-level
    BPE tokens (cut to max_len - 1) and the end token; each word's tag id at its last token
    (GPTForTokenClassification reads it there and at the token after), `word_ids` naming the word there,
    IGNORE_INDEX and -1 elsewhere. A word cut off, whole or in part, has no position and is scored as untagged."""
    label_to_id = {label: i for i, label in enumerate(labels)}
    features = []
    for index, (sentence, encoding) in enumerate(zip(sentences, tokenizer.encode_batch(
            [s.tokens for s in sentences], is_pretokenized=True))):
        ids = [*encoding.ids[: max_len - 1], end_id]
        last: dict[int, int] = {}
        for position, word in enumerate(encoding.word_ids):
            if word is not None:
                last[word] = position
        word_ids, token_labels = [-1] * len(ids), [IGNORE_INDEX] * len(ids)
        for word, position in last.items():
            if position < len(ids) - 1:
                word_ids[position], token_labels[position] = word, label_to_id[sentence.tags[word]]
        features.append({"input_ids": np.asarray(ids, dtype=np.int64),
                         "token_type_ids": np.zeros(len(ids), dtype=np.int64),
                         "labels": np.asarray(token_labels, dtype=np.int64),
                         "word_ids": np.asarray(word_ids, dtype=np.int64), "example_index": index})
    return features


def tagging_task_data(task: DictConfig, data_dir: Path, tokenizer, max_len: int, max_train_examples: int | None,
                      seed: int, selection_fraction: float | None = None) -> TaskData:
    """A CoNLL tagging task for GPTForTokenClassification (its end token after the pretrained vocabulary), scored by
    TokenClassificationModule as BERT's is."""
    train, dev = conll_splits(task, data_dir, max_train_examples, seed, selection_fraction)
    labels = list(task.labels)
    vocab_size = tokenizer.get_vocab_size()
    end_id = vocab_size + GPTForTokenClassification.N_SPECIAL - 1
    train_features = tagging_features(tokenizer, train, labels, max_len, end_id)

    def make_model(config):
        return GPTForTokenClassification(
            type(config)(**{**vars(config), "vocab_size": vocab_size + GPTForTokenClassification.N_SPECIAL}),
            len(labels))

    return TaskData(train_features, tagging_features(tokenizer, dev, labels, max_len, end_id),
                    collate_token_classification, make_model,
                    partial(TokenClassificationModule, labels=labels, dev_tags=[s.tags for s in dev],
                            metric=task.metric), majority_tag_scores(task, train, dev),
                    train_lengths=[len(feature["input_ids"]) for feature in train_features])


# GPT-2 (Radford et al. 2019, Sec. 3.6) summarised zero-shot by continuing an article followed by "TL;DR:"; fine-tuned
# on (article, summary) pairs in that format, the decoder alone is the baseline an encoder-decoder must beat
# (Khandelwal et al. 2019, "Sample Efficient Text Summarization Using a Single Pre-Trained Transformer")
SUMMARY_DELIMITER = " TL;DR:"


def generation_rows(tokenizer, sources: list[str], targets: list[str], max_source: int, max_target: int,
                    eos: int) -> list[dict]:
    """Each pair as one sequence: the source's first max_source tokens, SUMMARY_DELIMITER, then the target's tokens
    (cut to max_target - 1) and eos. `prompt` is what generation continues (source and delimiter); `input_ids` the
    sequence without its last token, `targets` the next token at each position, IGNORE_INDEX over the prompt: the loss
    is the target's given the source, as the encoder-decoder's."""
    delimiter = tokenizer.encode(SUMMARY_DELIMITER).ids
    rows = []
    for index, (source, target) in enumerate(zip(tokenizer.encode_batch(sources),
                                                 tokenizer.encode_batch([" " + t for t in targets]))):
        prompt, answer = [*source.ids[:max_source], *delimiter], [*target.ids[: max_target - 1], eos]
        rows.append({"prompt": prompt, "input_ids": np.asarray([*prompt, *answer[:-1]], dtype=np.int64),
                     "targets": np.asarray([IGNORE_INDEX] * (len(prompt) - 1) + answer, dtype=np.int64),
                     "index": index})
    return rows


def collate_generation(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """generation_rows -> input_ids (B, T) right-padded with pad_id (never read: attention is causal and padding is
    not scored), targets (B, T) padded with IGNORE_INDEX, and each row's index in its split."""
    return {"input_ids": pad_right([r["input_ids"] for r in rows], pad_id),
            "targets": pad_right([r["targets"] for r in rows], IGNORE_INDEX),
            "index": torch.tensor([r["index"] for r in rows])}


class GPTGenerationModule(GenerationModule):
    """The LM's loss on the target's tokens after the prompt."""

    def model_step(self, batch: dict) -> tuple[torch.Tensor, None]:
        return self.model(batch["input_ids"], batch["targets"]).loss, None


def generation_task_data(task: DictConfig, data_dir: Path, tokenizer, n_positions: int, max_seq_length: int,
                         max_train_examples: int | None, seed: int, samples_path: Path,
                         selection_fraction: float | None = None) -> TaskData:
    """A generation task (format: seq2seq) for the GPT LM itself, in GPT-2's "TL;DR:" format (generation_rows): the
    source is cut to finetune.max_seq_length and so that its prompt and max_target_tokens fit the context; dev is
    scored on the beam-searched continuation of each prompt (GenerationModule)."""
    train, dev, _ = tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
    eos = tokenizer.token_to_id(END_OF_TEXT)
    max_target = int(task.max_target_tokens)
    max_source = min(max_seq_length, n_positions - len(tokenizer.encode(SUMMARY_DELIMITER).ids) - max_target)
    if max_source < 1:
        raise ValueError(f"task {task.name}: its max_target_tokens={max_target} leaves no room for the source in "
                         f"GPT's context of {n_positions} tokens; lower it in tasks/{task.name}.yaml")
    train_rows, dev_rows = (generation_rows(tokenizer, split.texts_a, split.labels, max_source, max_target, eos)
                            for split in (train, dev))
    module = partial(GPTGenerationModule, metric=task.metric, tokenizer=tokenizer,
                     dev_inputs=[row["prompt"] for row in dev_rows], dev_sources=list(dev.texts_a),
                     references=list(dev.labels), samples_path=samples_path, max_new_tokens=max_target,
                     **task_decoding(task), **scoring_options(task))
    return TaskData(train_rows, dev_rows, partial(collate_generation, pad_id=eos), GPTLMHeadModel, module, None,
                    train_lengths=[len(row["input_ids"]) for row in train_rows])


@dataclass
class GPTTaskModels(WritingTaskModels):
    """A gpt_pretrain model directory and its tokenizer; `piece_vector_start`: instead of the directory's weights or
    their fresh initialisation, start where pretraining does (the control; `model_dir` is then the tokenizer's, whose
    weights are not read); `settings`: what GPT adds to `finetune` (λ, the head's pooling), the same for every kind;
    `pieces_with_vectors`: where the token embeddings start from the piece vectors (the control, or a model whose
    pretraining started there), which token ids have one (finetune.freeze_embeddings=with_vector keeps those rows)."""
    piece_vector_start: PieceVectorStart | None = None
    settings: GptFinetuneConfig = field(default_factory=GptFinetuneConfig)
    pieces_with_vectors: np.ndarray | None = None

    def encode(self, task: DictConfig, data_dir: Path, finetune: FinetuneConfig, seed: int,
               selection_fraction: float | None) -> TaskData:
        start = self.piece_vector_start
        n_positions = read_config(self.model_dir)["n_positions"] if start is None else start.config.n_positions
        return load_task_data(task, data_dir, self.tokenizer, n_positions, finetune.max_seq_length,
                              finetune.max_train_examples, seed, selection_fraction, self.samples_path(task.name),
                              self.settings)

    def build(self, data: TaskData) -> nn.Module:
        start = self.piece_vector_start
        # Reading the LM builds one, which draws from the seed's random stream before the task model is built; the
        # control draws one of its architecture in that place, so that its head and layers are gpt_random's at the
        # same seed: the kinds of a seed differ by where their weights start alone.
        lm = load_pretrained(self.model_dir) if start is None else GPTLMHeadModel(start.config)
        model = data.make_model(lm.config)  # seeded by the fine-tuning run: the twin's initialisation
        if start is not None:
            # a generation task fine-tunes the LM itself; the task's new tokens keep their fresh rows
            start_word_embeddings((model if isinstance(model, GPTLMHeadModel) else model.lm).transformer.wte,
                                  start.vectors)
        elif self.pretrained:
            if isinstance(model, GPTLMHeadModel):
                model.load_state_dict(lm.state_dict())
            else:
                model.load_lm(lm)
        return model


def _load(kind: str, pretrained: bool):
    def load(ctx: StageContext) -> GPTTaskModels:
        from tokenizers import Tokenizer

        model_dir = ctx.stage_dir("gpt_pretrain") / "model"
        vectors = (pieces_with_vectors(read_piece_vectors(ctx.stage_dir("gpt_piece_vectors")))
                   if pretrained and pretraining_starts_from_piece_vectors(ctx.cfg) else None)
        return GPTTaskModels(model_dir, Tokenizer.from_file(str(model_dir / "tokenizer.json")), kind,
                             ctx.out_dir / GENERATED_DIR, pretrained,
                             settings=typed_settings(ctx.cfg.finetune, GptFinetuneConfig), pieces_with_vectors=vectors)
    return load


def _pretrained_stages(cfg: DictConfig) -> tuple[str, ...]:
    """`gpt`'s: with the piece vectors its pretraining started from, whose rows fine-tuning may keep."""
    return ("gpt_pretrain",) + (("gpt_piece_vectors",) if pretraining_starts_from_piece_vectors(cfg) else ())


# `gpt`'s control (FinetuneKind.control) where its pretraining starts from the piece vectors
CONTROL = "gpt_w2v"


def _control(ctx: StageContext) -> GPTTaskModels:
    """gpt_w2v: the start of this run's pretraining without its steps, with the tokenizer `gpt` reads."""
    tokenizer_dir = ctx.stage_dir("gpt_tokenizer")
    tokenizer = load_gpt_tokenizer(tokenizer_dir)
    start = PieceVectorStart(scratch_config(ctx.cfg, tokenizer), read_piece_vectors(ctx.stage_dir("gpt_piece_vectors")))
    return GPTTaskModels(tokenizer_dir, tokenizer, CONTROL, ctx.out_dir / GENERATED_DIR, pretrained=False,
                         piece_vector_start=start,
                         settings=typed_settings(ctx.cfg.finetune, GptFinetuneConfig),
                         pieces_with_vectors=pieces_with_vectors(start.vectors))


def _control_of_gpt(cfg: DictConfig) -> str:
    """`gpt`'s control (FinetuneKind.control): gpt_w2v where its pretraining starts from the piece vectors, else the
    random twin."""
    return CONTROL if pretraining_starts_from_piece_vectors(cfg) else "gpt_random"


FINETUNE_KINDS = {"gpt": FinetuneKind(_pretrained_stages, _load("gpt", pretrained=True),
                                      random_twin="gpt_random", control=_control_of_gpt),
                  "gpt_random": FinetuneKind(lambda cfg: ("gpt_pretrain",), _load("gpt_random", pretrained=False)),
                  # what it reads leaves pretraining out: the control waits for no pretraining step
                  CONTROL: FinetuneKind(lambda cfg: ("gpt_tokenizer", "gpt_piece_vectors"), _control,
                                        control_of="gpt")}
