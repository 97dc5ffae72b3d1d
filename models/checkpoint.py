"""The checkpoint layout every model family here uses: `config.json` (the model's config dataclass plus a `format`
tag naming the family) and `model.safetensors` (its state dict). Plain torch and safetensors, no framework."""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def config_from_dict(cls, d: dict):
    """`cls(**d)` without the keys `cls` has no field for, so configs written by other tools (or a newer version
    of this code, or with the `format` tag) still load."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def save_checkpoint(model: torch.nn.Module, path, checkpoint_format: str) -> None:
    """Write `model` (which has a dataclass `config`) to directory `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**asdict(model.config), "format": checkpoint_format}, indent=2))
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}  # safetensors wants contiguous
    save_file(state, str(path / "model.safetensors"))


def random_twin(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The same architecture (class and config) freshly initialised from `seed`, the global RNG left as it was: the
    frozen random encoder a pretrained one must beat (Wieting & Kiela 2019, "No Training Required")."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return type(model)(model.config)


def read_config(path) -> dict:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no model checkpoint (config.json missing); run the stage that "
                                "trains it first, or point at a directory written by one")
    return json.loads((path / "config.json").read_text())


def load_checkpoint(path, model_class, config_class, checkpoint_format: str) -> torch.nn.Module:
    """A model written by save_checkpoint with `checkpoint_format`; any other directory is a clear error."""
    config = read_config(path)
    if config.get("format") != checkpoint_format:
        raise ValueError(f"{path}/config.json is not a {checkpoint_format} checkpoint (format "
                         f"{config.get('format')!r}); write one with this model family's save function")
    model = model_class(config_from_dict(config_class, config))
    model.load_state_dict(load_file(str(Path(path) / "model.safetensors")))
    return model


# the weights file of a HuggingFace model directory, in the order read_hf_weights prefers them
HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def hf_weights_file(path) -> Path | None:
    """The file read_hf_weights reads in the directory `path`, or None where it has none."""
    return next((Path(path) / name for name in HF_WEIGHT_FILES if (Path(path) / name).exists()), None)


def read_hf_weights(path) -> dict[str, torch.Tensor]:
    """The state dict of a HuggingFace model directory: model.safetensors, or the older pytorch_model.bin."""
    weights = hf_weights_file(path)
    if weights is None:
        raise FileNotFoundError(f"no {' or '.join(HF_WEIGHT_FILES)} in {path} (sharded checkpoints are not "
                                "supported)")
    if weights.suffix == ".safetensors":
        return load_file(str(weights))
    return torch.load(weights, map_location="cpu", weights_only=True)


def load_every_weight(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """load_state_dict that names both what the checkpoint lacks and what it has beyond the model: a converted
    checkpoint must fill the model exactly."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the config: missing {missing}, unexpected {unexpected}")
