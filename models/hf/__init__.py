"""This project's models as HuggingFace directories: what transformers' Auto classes load, written with json and
safetensors alone (transformers is needed to load them, never to write them).

A model transformers has classes for is written in their layout (BERT with learned positions and post-LN blocks as
BertForMaskedLM, GPT as GPT2LMHeadModel, a BART-shaped encoder-decoder as BartForConditionalGeneration:
models/hf/bert.py, models/hf/gpt.py and models/hf/seq2seq.py). Any other gets its modelling code beside the weights: one
`modeling_textrep_<model>.py` of this folder, which imports only torch and transformers, named in
config.json's `auto_map`, so that `AutoModel.from_pretrained(dir, trust_remote_code=True)` builds it on a machine
without this project (as MosaicBERT, Nomic BERT and Jina BERT ship theirs). Those files are the models' computation
written out plainly; the tests load every kind in a fresh process and compare its outputs with ours.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from models.checkpoint import read_config, read_hf_weights

CODE_DIR = Path(__file__).parent


def write_weights(path: Path, state: dict[str, torch.Tensor]) -> None:
    """model.safetensors of `state` (on the CPU, contiguous), tagged as transformers expects."""
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})  # HF checks for "format": "pt"


def write_config(path: Path, config: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_custom_model(path: Path, code: str, config: dict, auto_classes: dict[str, str],
                       state: dict[str, torch.Tensor]) -> None:
    """A directory whose model transformers builds from `code` (a modeling_*.py of this folder, copied into it):
    config.json with `auto_map` (Auto class -> `<code>.<class>`, AutoConfig included), and the weights."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(CODE_DIR / f"{code}.py", path / f"{code}.py")
    auto_map = {auto: f"{code}.{name}" for auto, name in auto_classes.items()}
    write_config(path, {**config, "auto_map": auto_map})
    write_weights(path, state)


def hf_state_and_config(path_or_state_dict, config, config_from_hf):
    """A from_hf's input as (state dict, config): a HuggingFace directory, whose config.json `config_from_hf` reads
    unless `config` is given, or a state dict, which needs `config`."""
    if isinstance(path_or_state_dict, dict):
        if config is None:
            raise ValueError("from_hf(state_dict) needs config=, the model's config (a state dict carries none)")
        return path_or_state_dict, config
    path = Path(path_or_state_dict)
    return read_hf_weights(path), config or config_from_hf(read_config(path))
