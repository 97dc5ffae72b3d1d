"""The Transformer encoder-decoder (models/seq2seq.py) as HuggingFace's BartForConditionalGeneration, and back.

Our parameter names are BART's, so a BART checkpoint is our state dict under `model.` with the shared embedding's tied
copies (`model.encoder.embed_tokens`, `model.decoder.embed_tokens`, `lm_head`) left out, and our Generator's bias as
`final_logits_bias`. BART computes the Transformer with post-LN blocks, a LayerNorm on the embeddings and learned
positions offset by 2 (models.seq2seq.BART_OPTIONS); a model with pre-LN blocks or sinusoidal positions has no
BartConfig (hf_incompatibility says why). Written with json and safetensors alone: transformers loads the directory,
it is never needed to write it.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from models.checkpoint import load_every_weight, read_config, read_hf_weights
from models.hf import write_config, write_weights
from models.seq2seq import EncoderDecoder, Seq2SeqConfig

BART_LAYER_NORM_EPS = 1e-5  # BART's nn.LayerNorm default, which its config cannot change
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


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


def to_hf(model: EncoderDecoder, path) -> None:
    """Write `model` as a BartForConditionalGeneration directory (config.json + model.safetensors). Its generation
    settings decode as models/generation.py does: from decoder_start_token_id, no forced tokens."""
    c, path = model.config, Path(path)
    why = hf_incompatibility(c)
    if why:
        raise ValueError(f"{why}; build the model with models.seq2seq.bart_config and copy_attention=False to export "
                         "it")
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
