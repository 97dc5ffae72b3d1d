"""BERT (models/bert.py) as a HuggingFace directory: transformers' own BertForMaskedLM layout where its BertModel
computes what ours does (learned absolute positions, post-LN blocks), else the same layout with modeling_textrep_bert.py
beside it. Either way AutoModel loads the encoder and, where the masked-LM head is included, AutoModelForMaskedLM
loads it with the head; the checkpoint is the BertForPreTraining layout (`bert.`, `cls.predictions.`, and
`cls.seq_relationship.` where next sentence prediction was trained), which models.bert.from_hf reads back."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from models.bert import HF_CONFIG_KEYS, BertConfig, BertModel, config_from_hf
from models.hf import write_config, write_custom_model, write_weights

if TYPE_CHECKING:  # never run (it needs transformers): the file is copied, and so part of the code version of
    # every stage that writes it (pipeline/engine/fingerprints.py follows imports)
    from models.hf import modeling_textrep_bert  # noqa: F401

CUSTOM_CODE = "modeling_textrep_bert"
CUSTOM_MODEL_TYPE = "textrep_bert"  # TextrepBertConfig.model_type in that file
MLM_BIAS = "cls.predictions.bias"  # present iff the directory has the masked-LM head


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
