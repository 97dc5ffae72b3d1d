"""BERT (models/bert.py) as a HuggingFace directory: transformers' own BertForMaskedLM layout where its BertModel
computes what ours does (learned absolute positions, post-LN blocks), else the same layout with modeling_textrep_bert.py
beside it. Either way AutoModel loads the encoder and, where the masked-LM head is included, AutoModelForMaskedLM
loads it with the head; the checkpoint is the BertForPreTraining layout (`bert.`, `cls.predictions.`, and
`cls.seq_relationship.` where next sentence prediction was trained), which from_hf reads back, as it reads
transformers' own BERT checkpoints. HF's parameter names are ours, so conversion only drops, strips and checks keys."""
from __future__ import annotations

import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from models.bert import CHECKPOINT_FORMAT, BertConfig, BertForPreTraining, BertModel, load_pretrained
from models.checkpoint import read_config
from models.hf import hf_state_and_config, write_config, write_custom_model, write_weights

if TYPE_CHECKING:  # never run (it needs transformers): the file is copied, and so part of the code version of
    # every stage that writes it (pipeline/engine/fingerprints.py follows imports)
    from models.hf import modeling_textrep_bert  # noqa: F401

CUSTOM_CODE = "modeling_textrep_bert"
CUSTOM_MODEL_TYPE = "textrep_bert"  # TextrepBertConfig.model_type in that file
MLM_BIAS = "cls.predictions.bias"  # present iff the directory has the masked-LM head


HF_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "type_vocab_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "layer_norm_eps", "initializer_range", "pad_token_id",
)


def config_from_hf(hf: dict) -> BertConfig:
    """Our BertConfig from the dict of a HuggingFace BERT config.json, or of one models/hf/bert.py wrote with its own
    modelling code (model_type textrep_bert: our config's fields as they are)."""
    if hf.get("model_type") == "textrep_bert":
        return BertConfig.from_dict(hf)
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"only hidden_act='gelu' is supported, got {hf['hidden_act']!r}")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"only position_embedding_type='absolute' is supported, got {hf['position_embedding_type']!r}")
    values = {k: hf[k] for k in HF_CONFIG_KEYS if hf.get(k) is not None}
    return BertConfig(**values, position_embedding_type="learned")


def _normalise_hf_keys(state_dict: dict) -> dict:
    """Strip the `bert.` prefix of task-model checkpoints and rename TF-era LayerNorm gamma/beta to weight/bias."""
    out = {}
    for key, value in state_dict.items():
        key = key.removeprefix("bert.")
        if key.endswith("LayerNorm.gamma"):
            key = key.removesuffix("gamma") + "weight"
        elif key.endswith("LayerNorm.beta"):
            key = key.removesuffix("beta") + "bias"
        out[key] = value
    return out


def _hf_state_and_config(path_or_state_dict, config):
    state, config = hf_state_and_config(path_or_state_dict, config, config_from_hf)
    return _normalise_hf_keys(state), config


def _encoder_state(state: dict) -> dict:
    """The encoder's entries of a normalised HF state dict: no task heads, no HF position_ids/token_type_ids buffers."""
    return {
        k: v for k, v in state.items()
        if k.startswith(("embeddings.", "encoder.", "pooler."))
        and k not in ("embeddings.position_ids", "embeddings.token_type_ids")
    }


def _load_checked(module: nn.Module, state: dict, may_miss: tuple[str, ...] = ()) -> None:
    """load_state_dict that names every mismatch, tolerating missing keys that start with one of `may_miss`."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(may_miss)]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the config: missing {missing}, unexpected {unexpected}")


def _warn_if_no_pooler(state: dict) -> None:
    # HF models saved with add_pooling_layer=False (e.g. from BertForMaskedLM) have no pooler weights.
    if not any(k.startswith("pooler.") for k in state):
        warnings.warn("checkpoint has no pooler weights; the pooler stays randomly initialised")


def from_hf(path_or_state_dict, config: BertConfig | None = None) -> BertModel:
    """BertModel from HuggingFace BERT weights: a directory (config.json + model.safetensors or pytorch_model.bin) or a
    state dict (then `config` is required), in BertModel layout or task-model layout (`bert.` prefix; heads ignored)."""
    state, config = _hf_state_and_config(path_or_state_dict, config)
    state = _encoder_state(state)
    _warn_if_no_pooler(state)
    model = BertModel(config)
    _load_checked(model, state, may_miss=("pooler.",))
    return model


def from_hf_pretraining(path_or_state_dict, config: BertConfig | None = None) -> BertForPreTraining:
    """BertForPreTraining (encoder + MLM/NSP heads) from a HuggingFace BertForPreTraining checkpoint or state dict."""
    state, config = _hf_state_and_config(path_or_state_dict, config)
    encoder = _encoder_state(state)
    _warn_if_no_pooler(encoder)
    # HF's decoder.weight / decoder.bias are tied copies of the word embeddings / cls.predictions.bias (and may be
    # absent from the file); our decoder weight is loaded through its bert.embeddings name.
    heads = {k: v for k, v in state.items() if k.startswith("cls.") and not k.startswith("cls.predictions.decoder.")}
    model = BertForPreTraining(config)
    full = {**{"bert." + k: v for k, v in encoder.items()}, **heads}
    _load_checked(model, full, may_miss=("bert.pooler.", BertForPreTraining.TIED_DECODER))
    return model


def continue_from_hf(path, vocab_size: int | None = None) -> tuple[BertForPreTraining, list[str]]:
    """BertForPreTraining from any HuggingFace BERT directory, to continue its pretraining (Gururangan et al. 2020):
    the encoder's weights, and the MLM and NSP heads where the checkpoint has them (a BertForPreTraining or
    BertForMaskedLM one), freshly initialised where it has not (a bare BertModel, as sentence encoders ship). With
    `vocab_size` above the checkpoint's, the word embeddings (and the MLM bias) get rows of padding, initialised as
    the others and never a target. Returns the model and the parts that were loaded."""
    state, config = _hf_state_and_config(path, None)
    model = BertForPreTraining(replace(config, vocab_size=max(vocab_size or 0, config.vocab_size)))
    own = model.state_dict()
    words = state["embeddings.word_embeddings.weight"]
    state["embeddings.word_embeddings.weight"] = torch.cat([words, own["bert.embeddings.word_embeddings.weight"]
                                                            [len(words):]])
    if "cls.predictions.bias" in state:
        bias = state["cls.predictions.bias"]
        state["cls.predictions.bias"] = torch.cat([bias, own["cls.predictions.bias"][len(bias):]])
    encoder = _encoder_state(state)
    heads = {k: v for k, v in state.items() if k.startswith("cls.") and not k.startswith("cls.predictions.decoder.")}
    _load_checked(model, {**{"bert." + k: v for k, v in encoder.items()}, **heads},
                  may_miss=("bert.pooler.", "cls.", BertForPreTraining.TIED_DECODER))
    loaded = ["encoder"] + [name for name, prefix in (("masked-LM head", "cls.predictions."),
                                                      ("next-sentence head", "cls.seq_relationship."))
                            if any(k.startswith(prefix) for k in heads)]
    return model, loaded


def load_ours_or_hf(path) -> BertModel:
    """An encoder written by models.bert.save_pretrained, or a HuggingFace BERT directory (told apart by config.json):
    what the pipeline reads where a run may point at either (finetune.external_encoder)."""
    path = Path(path)
    config = read_config(path)
    if config.get("format") == CHECKPOINT_FORMAT:
        return load_pretrained(path)
    if config.get("model_type") == "bert" or "architectures" in config:
        return from_hf(path)
    raise ValueError(f"{path}/config.json is neither a {CHECKPOINT_FORMAT} checkpoint nor a HuggingFace BERT config")


def hf_incompatibility(config: BertConfig) -> str:
    """Why HuggingFace's BertModel cannot compute what a model of `config` does, or "" when it can. Its BERT has learned
    absolute positions and post-LN blocks only: no fixed sinusoids (a frozen table it would train), no pre-LN, and no
    Shaw et al. relative positions (transformers 5 dropped its "relative_key" variants, which had no value term and
    no clipping anyway)."""
    if config.position_embedding_type != "learned" or config.pre_layer_norm:
        return ("HuggingFace's BertModel only expresses learned absolute positions with post-LN blocks; got "
                f"position_embedding_type={config.position_embedding_type!r}, pre_layer_norm={config.pre_layer_norm}")
    return ""


def to_hf(encoder: BertModel, path, heads: dict[str, torch.Tensor] | None = None) -> str:
    """Write `encoder`, and `heads` (HF-named `cls.*` tensors: models.bert's BertForPreTraining.heads_state_dict(),
    less the NSP head where it was never trained), as a directory transformers loads; returns the class AutoModel
    builds from it, or AutoModelForMaskedLM where the masked-LM head is included."""
    c, path = encoder.config, Path(path)
    heads = heads or {}
    state = {**{f"bert.{k}": v for k, v in encoder.state_dict().items()}, **heads}
    masked_lm = MLM_BIAS in heads
    if hf_incompatibility(c):
        classes = {"AutoConfig": "TextrepBertConfig", "AutoModel": "TextrepBertModel",
                   **({"AutoModelForMaskedLM": "TextrepBertForMaskedLM"} if masked_lm else {})}
        architecture = classes["AutoModelForMaskedLM" if masked_lm else "AutoModel"]
        write_custom_model(path, CUSTOM_CODE, {"architectures": [architecture], "model_type": CUSTOM_MODEL_TYPE,
                                               **asdict(c)}, classes, state)
        return architecture
    architecture = "BertForMaskedLM" if masked_lm else "BertModel"
    write_config(path, {"architectures": [architecture], "model_type": "bert", "hidden_act": "gelu",
                        "position_embedding_type": "absolute", **{k: getattr(c, k) for k in HF_CONFIG_KEYS}})
    write_weights(path, state)
    return architecture


POSITIONS = {"learned": "learned absolute positions", "sinusoidal": "fixed sinusoidal positions (Vaswani et al. 2017)",
             "relative": "relative positions (Shaw et al. 2018)"}


def describe(config: dict) -> str:
    """What a model card says of the model a to_hf directory's config.json describes."""
    c = config_from_hf(config)
    positions = POSITIONS[c.position_embedding_type]
    positions += (f", distances clipped at {c.max_relative_position}" if c.position_embedding_type == "relative"
                  else f", {c.max_position_embeddings} of them")
    norm = "pre-LayerNorm blocks with a final LayerNorm" if c.pre_layer_norm else "post-LayerNorm blocks (BERT's)"
    masked_lm = any(a.endswith("ForMaskedLM") for a in config.get("architectures", []))
    return (f"A BERT encoder (Devlin et al. 2019): {c.num_hidden_layers} layers, hidden size {c.hidden_size}, "
            f"{c.num_attention_heads} attention heads, feed-forward size {c.intermediate_size}, {positions}, {norm}, "
            f"a vocabulary of {c.vocab_size} rows (the tokenizer's, rounded up to a multiple of 64)."
            + (" With its masked-LM head (tied to the word embeddings): AutoModelForMaskedLM gives the logits, "
               "AutoModel the token states and the pooled [CLS] state." if masked_lm else
               " Encoder only: AutoModel gives the token states and the pooled [CLS] state."))
