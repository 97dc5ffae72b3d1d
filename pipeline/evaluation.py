"""The evaluate stage: SentEval-style probes of frozen sentence embeddings (Conneau & Kiela 2018; seed 000), one
row per encoder and task, comparing the model families with the bag-of-GloVe baseline of the seed."""
from __future__ import annotations

from typing import Callable

from omegaconf import DictConfig

from data_prep.shards import write_json_atomically
from data_prep.word_vectors import load_glove
from pipeline.dag import StageContext
from pipeline.elmo_stages import elmo_encoder
from pipeline.pretraining import encoder_stage
from pipeline.senteval import BertEncoder, Encoder, GloveBagOfWords, run_senteval
from pipeline.skip_thought_stages import skip_thought_encoder


def _bert(pooling: str, random_init: bool = False) -> Callable[[StageContext], Encoder]:
    def build(ctx: StageContext) -> Encoder:
        encoder_dir = ctx.stage_dir(encoder_stage(ctx.cfg)) / "encoder"
        return BertEncoder.from_directories(encoder_dir, ctx.stage_dir("tokenizer"), pooling=pooling,
                                            random_init_seed=ctx.cfg.seed if random_init else None,
                                            name=f"bert_{pooling}" + ("_random" if random_init else ""))
    return build


def _bert_stages(cfg: DictConfig) -> tuple[str, ...]:
    return "tokenizer", encoder_stage(cfg)


# encoder name -> (the stages whose outputs it needs, or a function of the config giving them; how to build it).
# Each `*_random` is its family's architecture freshly initialised and frozen: random encoders are strong probing
# baselines (Wieting & Kiela 2019), so a pretrained encoder has learned something only where it beats its twin.
ENCODERS: dict[str, tuple[tuple[str, ...] | Callable[[DictConfig], tuple[str, ...]],
                          Callable[[StageContext], Encoder]]] = {
    "bert_cls": (_bert_stages, _bert("cls")),
    "bert_mean": (_bert_stages, _bert("mean")),
    "bert_cls_random": (_bert_stages, _bert("cls", random_init=True)),
    "bert_mean_random": (_bert_stages, _bert("mean", random_init=True)),
    "glove_bow": ((), lambda ctx: GloveBagOfWords(load_glove())),
    "elmo": (("elmo_vocab", "elmo_pretrain"), elmo_encoder()),
    "elmo_random": (("elmo_vocab", "elmo_pretrain"), elmo_encoder(random_init=True)),
    "skip_thought": (("skip_thought_pretrain",), skip_thought_encoder(expand_vocabulary=False)),
    "skip_thought_random": (("skip_thought_pretrain",), skip_thought_encoder(expand_vocabulary=False,
                                                                             random_init=True)),
    "skip_thought_expanded": (("skip_thought_pretrain",), skip_thought_encoder(expand_vocabulary=True)),
}


def _check(cfg: DictConfig) -> list[str]:
    unknown = [e for e in cfg.evaluate.encoders if e not in ENCODERS]
    if unknown:
        raise ValueError(f"evaluate.encoders: unknown {unknown}; choose from {list(ENCODERS)}")
    return list(cfg.evaluate.encoders)


def evaluate_upstream(cfg: DictConfig) -> tuple[str, ...]:
    needed = {stage for name in _check(cfg)
              for stage in (ENCODERS[name][0](cfg) if callable(ENCODERS[name][0]) else ENCODERS[name][0])}
    return tuple(sorted(needed))


def evaluate(ctx: StageContext) -> dict:
    encoders = [ENCODERS[name][1](ctx) for name in _check(ctx.cfg)]
    rows = [{"model": row.pop("encoder"), **row, "std": 0.0, "seeds": 1}
            for row in run_senteval(encoders, ctx.cfg.senteval, ctx.cfg.seed)]
    write_json_atomically(ctx.out_dir / "results.json", rows)
    return {"results": rows}
