"""GPT (models/gpt.py) as a HuggingFace directory, transformers' GPT2LMHeadModel, and back: to_hf writes one, from_hf
reads it or any GPT-2 checkpoint our blocks compute; and what a model card says of it. HF's parameter names are ours;
its Conv1D keeps (in, out) weights, nn.Linear (out, in)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from safetensors.torch import save_file

from models.checkpoint import load_every_weight, read_config
from models.gpt import CHECKPOINT_FORMAT, GPTConfig, GPTLMHeadModel, load_pretrained
from models.hf import hf_state_and_config

HF_CONFIG_KEYS = (
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "embd_pdrop", "attn_pdrop", "resid_pdrop",
    "layer_norm_epsilon", "initializer_range", "eos_token_id",
)
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def config_from_hf(hf: dict) -> GPTConfig:
    """Our GPTConfig from the dict of a HuggingFace GPT-2 config.json; an error for what our blocks do not compute."""
    unsupported = {
        "activation_function": (hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh")),
        "n_inner": hf.get("n_inner") not in (None, 4 * hf.get("n_embd", 768)),
        "scale_attn_weights": not hf.get("scale_attn_weights", True),
        "scale_attn_by_inverse_layer_idx": hf.get("scale_attn_by_inverse_layer_idx", False),
        "add_cross_attention": hf.get("add_cross_attention", False),
        "tie_word_embeddings": not hf.get("tie_word_embeddings", True),
    }
    bad = [f"{key}={hf.get(key)!r}" for key, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ValueError(f"models.gpt computes GPT-2 with tanh GELU, a 4x MLP, 1/sqrt(hs) attention scaling and a "
                         f"tied head only; this config has {', '.join(bad)}")
    values = {k: hf[k] for k in HF_CONFIG_KEYS if k in hf}
    eos, vocab_size = values.get("eos_token_id"), values.get("vocab_size", GPTConfig.vocab_size)
    if eos is not None and not 0 <= eos < vocab_size:
        # transformers' GPT2Config keeps GPT-2's eos_token_id=50256 whatever vocab_size is, and loads such a model; a
        # small custom-vocabulary GPT-2 saved with it has no such token
        warnings.warn(f"the config's eos_token_id {eos} is outside the vocabulary of {vocab_size} tokens (GPT2Config's "
                      "default, kept whatever vocab_size is); the model is loaded without one: generation then runs "
                      "to max_new_tokens", stacklevel=2)
        values["eos_token_id"] = None
    return GPTConfig(**values)


def _state_from_hf(state: dict) -> dict:
    """Our state dict from a GPT2LMHeadModel's or GPT2Model's: `transformer.` prefix, Linear weights; HF's tied
    lm_head copy and the causal-mask buffers of old checkpoints (`attn.bias`, `attn.masked_bias`) dropped."""
    out = {}
    for key, value in state.items():
        if key == "lm_head.weight" or key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if not key.startswith("transformer."):
            key = "transformer." + key
        out[key] = value.t() if key.endswith(CONV1D_WEIGHTS) else value
    return out


def from_hf(path_or_state_dict, config: GPTConfig | None = None) -> GPTLMHeadModel:
    """GPTLMHeadModel from HuggingFace GPT-2 weights: a directory (config.json + model.safetensors or pytorch_model.bin)
    or a GPT2LMHeadModel / GPT2Model state dict (then `config` is required)."""
    state, config = hf_state_and_config(path_or_state_dict, config, config_from_hf)
    model = GPTLMHeadModel(config)
    load_every_weight(model, _state_from_hf(state))
    return model


def to_hf(model: GPTLMHeadModel, path) -> None:
    """Write `model` as a HuggingFace GPT2LMHeadModel directory (config.json + model.safetensors). HF ties lm_head to
    transformer.wte on load, as its own save_pretrained leaves it out."""
    c = model.config
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf_config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "tie_word_embeddings": True,
        **{k: getattr(c, k) for k in HF_CONFIG_KEYS},
        "bos_token_id": c.eos_token_id,  # GPT-2 starts and ends documents with the same <|endoftext|>
    }
    (path / "config.json").write_text(json.dumps(hf_config, indent=2))
    state = {}
    for key, value in model.state_dict().items():
        value = value.detach().cpu()
        state[key] = (value.t() if key.endswith(CONV1D_WEIGHTS) else value).contiguous()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})  # HF checks for "format": "pt"


def load_ours_or_hf(path) -> GPTLMHeadModel:
    """A model written by models.gpt.save_pretrained, or a HuggingFace GPT-2 directory (told apart by config.json): what
    pipeline.generate reads, pointed at a gpt_pretrain stage's model/ or hf/."""
    path = Path(path)
    config = read_config(path)
    if config.get("format") == CHECKPOINT_FORMAT:
        return load_pretrained(path)
    if config.get("model_type") == "gpt2":
        return from_hf(path)
    raise ValueError(f"{path}/config.json is neither a {CHECKPOINT_FORMAT} checkpoint nor a HuggingFace GPT-2 config; "
                     "write one with models.gpt.save_pretrained or models.hf.gpt.to_hf")


def describe(config: dict) -> str:
    """What a model card says of the model a to_hf directory's config.json describes."""
    return (f"A GPT-2-style causal language model (Radford et al. 2019): {config['n_layer']} pre-LayerNorm blocks, "
            f"hidden size {config['n_embd']}, {config['n_head']} attention heads, a context of "
            f"{config['n_positions']} tokens, {config['vocab_size']} byte-level BPE tokens, the output layer tied to "
            "the token embeddings. It is transformers' GPT2LMHeadModel: AutoModelForCausalLM gives next-token logits "
            "and `generate` continues a prompt.")
