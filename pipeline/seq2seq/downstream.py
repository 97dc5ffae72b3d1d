"""The encoder-decoder fine-tuned end to end on a generation task (`format: seq2seq`,
pipeline/downstream/generation.py): the label-smoothed loss of the target given the source, as in pretraining (BART,
Lewis et al. 2020, Sec. 3.4: the pretrained model fine-tuned whole, source into the encoder, target out of the decoder),
dev decoded by beam search. `finetune.models=[seq2seq]`: this run's pretrained model, and with it
(finetune.random_twins) `seq2seq_random`, its architecture untrained, which is also its control unless pretraining
started from piece vectors (pretrain.init_embeddings=word2vec): then the control is `seq2seq_w2v`, that start without
the pretraining steps."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from tokenizers import Tokenizer
from torch import nn

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer
from pipeline.downstream.generation import GENERATED_DIR, GenerationModule, WritingTaskModels, task_decoding
from pipeline.downstream.settings import FinetuneConfig
from pipeline.downstream.task_data import TaskData, tsv_splits
from pipeline.downstream.tasks import scoring_options
from pipeline.engine.dag import StageContext
from pipeline.engine.family import FinetuneKind
from pipeline.engine.pretraining import start_word_embeddings
from pipeline.engine.settings import typed_settings
from pipeline.piece_vectors import read_piece_vectors
from pipeline.seq2seq.architectures import load_model
from pipeline.seq2seq.module import PairCollator
from pipeline.seq2seq.pretrain import pretraining_starts_from_piece_vectors
from pipeline.seq2seq.settings import Seq2SeqFinetuneConfig


def encode_texts(tokenizer: Tokenizer, texts: list[str], max_len: int, eos: int) -> list[np.ndarray]:
    """Each text's tokens cut to max_len - 1, then the end token (as pretraining's sources and targets end). Each
    text is encoded after a space, as a word inside running text: byte-level BPE makes a word's leading space part of
    its first piece, so without it a headline's first word ("Deutsche") would be other pieces than the same word in
    its article (" Deutsche"), which copy attention copies (docs/seq2seq.md); most pretraining blocks start inside a
    book, after a space, too."""
    return [np.asarray([*e.ids[: max_len - 1], eos], dtype=np.int64)
            for e in tokenizer.encode_batch([" " + text.lstrip() for text in texts])]


class IndexedPairCollator(PairCollator):
    """A batch of pairs (PairCollator) with each row's position in its split: dev's generations go back to their
    references by it."""

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        return {**super().__call__(rows), "index": torch.tensor([row["index"] for row in rows])}


class Seq2SeqGenerationModule(GenerationModule):
    """The target's loss given the source, label-smoothed in training (the model's LabelSmoothing), as in
    pretraining."""

    def model_step(self, batch: dict) -> tuple[torch.Tensor, None]:
        out = self.model(batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"], batch["targets"])
        return out.loss, None


def load_task_data(task: DictConfig, data_dir: Path, tokenizer: Tokenizer, pretrained: nn.Module, max_seq_length: int,
                   max_train_examples: int | None, seed: int, samples_path: Path,
                   selection_fraction: float | None = None) -> TaskData:
    """A seq2seq task's pairs encoded with the pretraining tokenizer, sources cut to the model's positions (and
    finetune.max_seq_length), targets to the task's max_target_tokens; make_model, the pretrained model's class
    (either architecture, pipeline/seq2seq/architectures.py), takes its config."""
    config = pretrained.config
    if task.format != "seq2seq":
        raise ValueError(f"task {task.name}: {task.format} tasks are not supported for seq2seq (it fine-tunes on "
                         "generation tasks, format: seq2seq); drop seq2seq and seq2seq_random from finetune.models "
                         "for it")
    train, dev, _ = tsv_splits(task, data_dir, max_train_examples, seed, selection_fraction)
    max_source, max_target = min(max_seq_length, config.max_positions), min(task.max_target_tokens,
                                                                            config.max_positions)
    eos = config.eos_token_id

    def rows(split) -> list[dict]:
        sources, targets = (encode_texts(tokenizer, split.texts_a, max_source, eos),
                            encode_texts(tokenizer, split.labels, max_target, eos))
        return [{"source": s, "target": t, "index": i} for i, (s, t) in enumerate(zip(sources, targets))]

    train_rows, dev_rows = rows(train), rows(dev)
    module = partial(Seq2SeqGenerationModule, metric=task.metric, tokenizer=tokenizer,
                     dev_inputs=[row["source"].tolist() for row in dev_rows], dev_sources=list(dev.texts_a),
                     references=list(dev.labels), samples_path=samples_path, max_new_tokens=max_target,
                     **task_decoding(task), **scoring_options(task))
    return TaskData(train_rows, dev_rows, IndexedPairCollator(config.pad_token_id, config.decoder_start_token_id),
                    type(pretrained), module, None,
                    train_lengths=[len(r["source"]) + len(r["target"]) for r in train_rows])


@dataclass
class Seq2SeqTaskModels(WritingTaskModels):
    """A seq2seq_pretrain model directory and its tokenizer; a kind that is not `pretrained` starts from a fresh
    initialisation, its shared embeddings set to `piece_vectors` where given (the control's start). `dropout`: the
    fine-tuned model's (finetune.seq2seq_dropout), None to keep the pretrained model's."""
    piece_vectors: np.ndarray | None = None
    dropout: float | None = None

    def encode(self, task: DictConfig, data_dir: Path, finetune: FinetuneConfig, seed: int,
               selection_fraction: float | None) -> TaskData:
        return load_task_data(task, data_dir, self.tokenizer, load_model(self.model_dir),
                              finetune.max_seq_length, finetune.max_train_examples, seed,
                              self.samples_path(task.name), selection_fraction)

    def build(self, data: TaskData) -> nn.Module:
        pretrained = load_model(self.model_dir)
        config = pretrained.config if self.dropout is None else replace(pretrained.config, dropout=self.dropout)
        model = data.make_model(config)  # seeded by the fine-tuning run: the twin's initialisation
        if self.pretrained:
            model.load_state_dict(pretrained.state_dict())
        elif self.piece_vectors is not None:
            start_word_embeddings(model.shared, self.piece_vectors)
        return model


def _load(kind: str, pretrained: bool):
    def load(ctx: StageContext) -> Seq2SeqTaskModels:
        model_dir = ctx.stage_dir("seq2seq_pretrain") / "model"
        return Seq2SeqTaskModels(model_dir, load_seq2seq_tokenizer(model_dir), kind, ctx.out_dir / GENERATED_DIR,
                                 pretrained, dropout=_dropout(ctx.cfg))
    return load


# `seq2seq`'s control (FinetuneKind.control) where its pretraining starts from the piece vectors
CONTROL = "seq2seq_w2v"


def _control(ctx: StageContext) -> Seq2SeqTaskModels:
    """seq2seq_w2v: the start of this run's pretraining, the piece vectors in a freshly initialised model of the
    pretrained one's architecture, without its steps."""
    model_dir = ctx.stage_dir("seq2seq_pretrain") / "model"
    return Seq2SeqTaskModels(model_dir, load_seq2seq_tokenizer(model_dir), CONTROL, ctx.out_dir / GENERATED_DIR,
                             pretrained=False,
                             piece_vectors=read_piece_vectors(ctx.stage_dir("seq2seq_piece_vectors")),
                             dropout=_dropout(ctx.cfg))


def _dropout(cfg: DictConfig) -> float | None:
    return typed_settings(cfg.finetune, Seq2SeqFinetuneConfig).seq2seq_dropout


def _control_of_seq2seq(cfg: DictConfig) -> str:
    """The same start without the pretraining steps: seq2seq_w2v where pretraining starts from the piece vectors,
    else the random twin, which the report then names as the control too instead of fine-tuning a second copy."""
    return CONTROL if pretraining_starts_from_piece_vectors(cfg) else "seq2seq_random"


FINETUNE_KINDS = {
    "seq2seq": FinetuneKind(lambda cfg: ("seq2seq_pretrain",), _load("seq2seq", pretrained=True),
                            random_twin="seq2seq_random", control=_control_of_seq2seq),
    "seq2seq_random": FinetuneKind(lambda cfg: ("seq2seq_pretrain",), _load("seq2seq_random", pretrained=False)),
    CONTROL: FinetuneKind(lambda cfg: ("seq2seq_pretrain", "seq2seq_piece_vectors"), _control, control_of="seq2seq")}
