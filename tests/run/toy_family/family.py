"""A family of the tests' own (tests/run/test_families.py), written as a real one is: this folder and its record.
Its pretraining stage writes a model that writes each text reversed, and that model as a HuggingFace directory with a
one-row vocabulary; its encoder and fine-tune kind are names the downstream stages resolve, never built."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models

from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.family import EncoderSpec, Family, FinetuneKind, Generation, Tiny

STAGE = "toy_pretrain"
VALIDATED: list[list[str]] = []  # the stages each start-up check was told the run has


def toy_pretrain(ctx: StageContext) -> dict:
    (ctx.out_dir / "model").mkdir()
    (ctx.out_dir / "model" / "config.json").write_text(json.dumps({"writes": "reversed"}))
    hf = ctx.out_dir / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["ToyModel"], "model_type": "toy", "width": 4}))
    save_file({"embeddings": torch.zeros(1, 4)}, str(hf / "model.safetensors"), metadata={"format": "pt"})
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(hf / "tokenizer.json"))
    return {"steps": 0}


def reversed_texts(model_dir: Path, texts: list[str], request, fast_kernels: bool) -> list[list[str]]:
    assert json.loads((model_dir / "config.json").read_text())["writes"] == "reversed"
    return [[text[::-1]] for text in texts]


def upstream(cfg) -> tuple[str, ...]:
    return (STAGE,)


FAMILY = Family("toy", stages=(Stage(STAGE, toy_pretrain, ("prepare",), ("seed",)),), pretraining_stages=(STAGE,),
                encoders={"toy_bow": EncoderSpec(upstream, lambda ctx: None)},
                finetune_kinds={"toy": FinetuneKind(upstream, lambda ctx: None)},
                validate=lambda cfg, stages: VALIDATED.append(stages),
                describe_export=lambda config: f"A toy model of width {config['width']}.",
                generation=Generation(STAGE, "bert_tiny", reversed_texts),
                tiny=Tiny("bert_tiny", ("prepare",)))
