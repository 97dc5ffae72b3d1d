"""The seq2seq family's encoder-decoders as HuggingFace directories: the Transformer (models/seq2seq.py) as
transformers' BartForConditionalGeneration where BART computes it, and back; any other Transformer (seed 000's pre-LN,
sinusoidal one, or one with copy attention) and the RNN encoder-decoder (models/rnn_seq2seq.py) in their own layout
with their modelling code beside the weights (modeling_textrep_seq2seq.py, modeling_textrep_rnn_seq2seq.py, which
compute See et al. 2017's pointer-generator too), which AutoModelForSeq2SeqLM loads with trust_remote_code=True. Either
way its `generate` writes text from a source.

Our parameter names are BART's, so a BART checkpoint is our state dict under `model.` with the shared embedding's tied
copies (`model.encoder.embed_tokens`, `model.decoder.embed_tokens`, `lm_head`) left out, and our Generator's bias as
`final_logits_bias`. BART computes the Transformer with post-LN blocks, a LayerNorm on the embeddings and learned
positions offset by 2 (models.seq2seq.BART_OPTIONS), and writes from its vocabulary distribution alone; a model with
pre-LN blocks, sinusoidal positions or copy attention has no BartConfig (hf_incompatibility says why). Written with
json and safetensors alone: transformers loads the directory, it is never needed to write it.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from models.checkpoint import load_every_weight, read_config, read_hf_weights
from models.hf import write_config, write_custom_model, write_weights
from models.rnn_seq2seq import RNNEncoderDecoder
from models.seq2seq import EncoderDecoder, Seq2SeqConfig

if TYPE_CHECKING:  # never run (they need transformers): the files are copied, and so part of the code version of
    # every stage that writes them (pipeline/engine/fingerprints.py follows imports)
    from models.hf import modeling_textrep_rnn_seq2seq, modeling_textrep_seq2seq  # noqa: F401

BART_LAYER_NORM_EPS = 1e-5  # BART's nn.LayerNorm default, which its config cannot change
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
# The modelling code of each architecture BART cannot express, and the classes config.json's auto_map names in it
CUSTOM = {EncoderDecoder: ("modeling_textrep_seq2seq", "textrep_seq2seq", "TextrepSeq2Seq"),
          RNNEncoderDecoder: ("modeling_textrep_rnn_seq2seq", "textrep_rnn_seq2seq", "TextrepRNNSeq2Seq")}
# what only training reads: the loss's label smoothing and the dropout rates (the modelling code computes inference)
TRAINING_ONLY = ("label_smoothing", "dropout", "attention_dropout", "activation_dropout", "init_range")


def hf_incompatibility(config) -> str:
    """Why BartForConditionalGeneration cannot compute what a model of `config` does, or "" when it can."""
    if not isinstance(config, Seq2SeqConfig):  # models/rnn_seq2seq.py's RNN encoder-decoder
        return (f"not exportable as BART: HuggingFace's BartForConditionalGeneration is a Transformer "
                f"(models.seq2seq.Seq2SeqConfig); this model's config is {type(config).__name__}")
    if config.copy_attention:
        return ("not exportable as BART: HuggingFace's BART writes from its vocabulary distribution alone, and this "
                "model mixes in copying from the source (copy_attention=True, See et al.'s pointer-generator)")
    bart = dict(pre_layer_norm=False, layernorm_embedding=True, position_embedding_type="learned",
                learned_position_offset=2, layer_norm_eps=BART_LAYER_NORM_EPS)
    differ = [f"{key}={getattr(config, key)!r}" for key, value in bart.items() if getattr(config, key) != value]
    if differ:
        return (f"HuggingFace's BART computes post-LN blocks, a LayerNorm on the embeddings and learned positions "
                f"offset by 2 (models.seq2seq.BART_OPTIONS), LayerNorm eps 1e-5; this model has {', '.join(differ)}")
    return ""


def hf_architecture(model: nn.Module) -> str:
    """The class AutoModelForSeq2SeqLM builds from the directory to_hf writes of `model`."""
    if isinstance(model, EncoderDecoder) and not hf_incompatibility(model.config):
        return "BartForConditionalGeneration"
    return f"{CUSTOM[type(model)][2]}ForConditionalGeneration"


def to_hf(model: nn.Module, path) -> str:
    """Write the encoder-decoder `model` as a directory transformers loads: BART where hf_incompatibility finds
    nothing, else our layout with our modelling code (models/hf/__init__.py), the pointer-generator's gate
    (`pointer.p_gen`) included; returns hf_architecture(model)."""
    architecture = hf_architecture(model)
    if architecture == "BartForConditionalGeneration":
        to_bart(model, path)
        return architecture
    code, model_type, prefix = CUSTOM[type(model)]
    classes = {"AutoConfig": f"{prefix}Config", "AutoModelForSeq2SeqLM": architecture}
    config = {k: v for k, v in asdict(model.config).items() if k not in TRAINING_ONLY}
    state = model.state_dict()
    if isinstance(model, EncoderDecoder):  # BART's name for the Generator's bias, as to_bart writes it
        state["final_logits_bias"] = state.pop("generator.bias")
    write_custom_model(Path(path), code, {"architectures": [architecture], "model_type": model_type, **config},
                       classes, state)
    return architecture


def to_bart(model: EncoderDecoder, path) -> None:
    """Write `model` as a BartForConditionalGeneration directory (config.json + model.safetensors). Its generation
    settings decode as models/generation.py does: from decoder_start_token_id, no forced tokens."""
    c, path = model.config, Path(path)
    why = hf_incompatibility(c)
    if why:
        raise ValueError(f"{why}; build the model with models.seq2seq.bart_config and copy_attention=False to write it "
                         "as BART (to_hf writes any other with our modelling code)")
    write_config(path, {
        "architectures": ["BartForConditionalGeneration"], "model_type": "bart", "is_encoder_decoder": True,
        "vocab_size": c.vocab_size, "d_model": c.d_model, "max_position_embeddings": c.max_positions,
        "encoder_layers": c.encoder_layers, "decoder_layers": c.decoder_layers,
        "encoder_attention_heads": c.n_head, "decoder_attention_heads": c.n_head,
        "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff, "activation_function": c.activation,
        "dropout": c.dropout, "attention_dropout": c.attention_dropout, "activation_dropout": c.activation_dropout,
        "scale_embedding": c.scale_embedding, "tie_word_embeddings": True,
        "pad_token_id": c.pad_token_id, "bos_token_id": None, "eos_token_id": c.eos_token_id,
        "decoder_start_token_id": c.decoder_start_token_id, "forced_bos_token_id": None, "forced_eos_token_id": None,
    })
    state = {f"model.{key}": value for key, value in model.state_dict().items() if not key.startswith("generator.")}
    write_weights(path, {**state, "final_logits_bias": model.generator.bias.detach()[None]})


def config_from_hf(hf: dict) -> Seq2SeqConfig:
    """Our Seq2SeqConfig from the dict of a HuggingFace BART config.json; an error for what our model does not
    compute."""
    unsupported = {
        "activation_function": hf.get("activation_function", "gelu") not in ("gelu", "relu"),
        "tie_word_embeddings": not hf.get("tie_word_embeddings", True),
        "normalize_before": hf.get("normalize_before", False),  # fairseq-era mBART flags
        "add_final_layer_norm": hf.get("add_final_layer_norm", False),
    }
    bad = [f"{key}={hf.get(key)!r}" for key, is_bad in unsupported.items() if is_bad]
    bad += [f"{encoder}={hf.get(encoder)!r} and {decoder}={hf.get(decoder)!r}"
            for encoder, decoder in (("encoder_attention_heads", "decoder_attention_heads"),
                                     ("encoder_ffn_dim", "decoder_ffn_dim")) if hf.get(encoder) != hf.get(decoder)]
    if bad:
        raise ValueError(f"models.seq2seq computes BART with equal encoder and decoder heads and widths, a GELU or "
                         f"ReLU feed-forward and tied embeddings; this config has {', '.join(bad)}")
    eos = hf.get("eos_token_id", 2)
    return Seq2SeqConfig(
        vocab_size=hf["vocab_size"], d_model=hf["d_model"], max_positions=hf["max_position_embeddings"],
        encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
        n_head=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        activation=hf.get("activation_function", "gelu"), dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.0), activation_dropout=hf.get("activation_dropout", 0.0),
        scale_embedding=hf.get("scale_embedding", False), pad_token_id=hf.get("pad_token_id", 1),
        decoder_start_token_id=hf.get("decoder_start_token_id", 2), eos_token_id=eos[0] if isinstance(eos, list)
        else eos, label_smoothing=0.0, pre_layer_norm=False, layernorm_embedding=True,
        position_embedding_type="learned", learned_position_offset=2, layer_norm_eps=BART_LAYER_NORM_EPS)


def _state_from_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict from a BartForConditionalGeneration's, or a BartModel's (no `model.` prefix, no bias)."""
    state = {key if key.startswith(("model.", "lm_head.", "final_logits_bias")) else f"model.{key}": value
             for key, value in state.items()}
    if "lm_head.weight" in state and not torch.equal(state["lm_head.weight"], state["model.shared.weight"]):
        raise ValueError("the checkpoint's lm_head differs from its shared embeddings: models.seq2seq ties them")
    out = {key.removeprefix("model."): value for key, value in state.items()
           if key not in TIED and key != "final_logits_bias"}
    bias = state.get("final_logits_bias")
    out["generator.bias"] = torch.zeros(len(out["shared.weight"])) if bias is None else bias.reshape(-1)
    return out


def from_hf(path_or_state_dict, config: Seq2SeqConfig | None = None) -> EncoderDecoder:
    """EncoderDecoder from HuggingFace BART weights: a directory (config.json + model.safetensors or pytorch_model.bin)
    or a BartForConditionalGeneration / BartModel state dict (then `config` is required)."""
    if isinstance(path_or_state_dict, dict):
        if config is None:
            raise ValueError("from_hf(state_dict) needs config=Seq2SeqConfig(...)")
        state = path_or_state_dict
    else:
        path = Path(path_or_state_dict)
        hf = read_config(path)
        if hf.get("model_type") != "bart":
            raise ValueError(f"{path}/config.json is not a HuggingFace BART config (model_type "
                             f"{hf.get('model_type')!r})")
        if hf.get("forced_bos_token_id") is not None or hf.get("forced_eos_token_id") is not None:
            warnings.warn("the config forces tokens in HF's generate (forced_bos_token_id / forced_eos_token_id); "
                          "models/generation.py forces none", stacklevel=2)
        config = config or config_from_hf(hf)
        state = read_hf_weights(path)
    model = EncoderDecoder(config)
    load_every_weight(model, _state_from_hf(state))
    return model


def describe(config: dict) -> str:
    """What a model card says of the encoder-decoder a to_hf directory's config.json describes."""
    if config["model_type"] == "textrep_rnn_seq2seq":
        cell = config["cell"].upper()
        body = (f"An RNN encoder-decoder with attention (Luong et al. 2015): bidirectional {cell} encoder, {cell} "
                f"decoder, {config['num_layers']} layer(s) each, hidden size {config['hidden_size']}, "
                f"{config['embedding_dim']}-value embeddings shared by source, target and output, "
                f"{config['attention']} attention" + (", input feeding" if config["input_feeding"] else ""))
        copying = "its attention"
    else:
        bart = config["model_type"] == "bart"
        heads, width = (config["encoder_attention_heads"], config["encoder_ffn_dim"]) if bart else \
            (config["n_head"], config["d_ff"])
        shape = ("post-LayerNorm blocks, learned positions (BART's layout)" if bart else
                 f"{'pre' if config['pre_layer_norm'] else 'post'}-LayerNorm blocks, "
                 f"{config['position_embedding_type']} positions")
        body = (f"A Transformer encoder-decoder (Vaswani et al. 2017): {config['encoder_layers']} + "
                f"{config['decoder_layers']} layers, hidden size {config['d_model']}, {heads} attention heads, "
                f"feed-forward size {width}, {shape}")
        copying = "the last decoder layer's attention over the source, averaged over heads,"
    if config.get("copy_attention"):  # BART's config has none: BART cannot copy
        body += (f", copy attention (See et al. 2017's pointer-generator, which the modelling code computes: {copying} "
                 "copies source tokens into the output, whose logits are the mixture's log-probabilities)")
    return (f"{body}, {config['vocab_size']} byte-level BPE tokens, pretrained to restore noised text (denoising). "
            "AutoModelForSeq2SeqLM gives next-token logits and `generate` writes a target from a source (end the "
            "source with the tokenizer's eos token, as in training).")
