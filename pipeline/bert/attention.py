"""The report's BERT section: the attention heat-map of one head of the pretrained encoder on a sentence
(`report.attention_sentence`, `report.attention_layer`, `report.attention_head`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from pipeline.bert.pretrain import encoder_stage
from pipeline.bert.settings import AttentionReportConfig
from pipeline.engine.settings import cache_dir_of, stages_in_run, typed_settings
from pipeline.engine.training import TrainerConfig
from pipeline.report.fonts import font_for
from pipeline.report.plots import plot_attention


@dataclass(frozen=True)
class AttentionRequest:
    """Which attention head to draw, on which sentence (report.attention_* in the config)."""
    sentence: str
    layer: int  # 0-based; negative counts from the last layer
    head: int


@dataclass(frozen=True)
class AttentionMap:
    tokens: list[str]  # [CLS] … [SEP]
    matrix: np.ndarray  # (T, T); row i is query token i's distribution over the keys
    layer: int  # 0-based, resolved from a negative request
    num_layers: int
    head: int
    truncated: bool = False  # the sentence had more tokens than the encoder has positions


def attention_matrix(encoder_dir: Path, tokenizer_dir: Path, request: AttentionRequest,
                     fast_kernels: bool = True) -> AttentionMap:
    """The attention probabilities of the requested layer and head of the encoder on the sentence, in eval mode
    (no dropout); with models/kernels.py's modules where `fast_kernels` (trainer.fast_kernels)."""
    import torch

    from data_prep.corpus.tokenizer import load_tokenizer
    from models.bert import load_pretrained
    from models.kernels import use_fast_kernels

    model = load_pretrained(encoder_dir).eval()
    if fast_kernels:
        use_fast_kernels(model)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    if not -layers <= request.layer < layers:
        raise ValueError(f"report.attention_layer={request.layer}, but the encoder has {layers} layers; use "
                         f"0..{layers - 1} (or -1 for the last)")
    if not 0 <= request.head < heads:
        raise ValueError(f"report.attention_head={request.head}, but the encoder has {heads} heads per layer; use "
                         f"0..{heads - 1}")
    tokenizer = load_tokenizer(tokenizer_dir)
    if model.config.position_embedding_type != "relative":
        # A sentence longer than the encoder's positions is cut (keeping [CLS] … [SEP]), not an error: the heat-map
        # must never cost a run its results table.
        tokenizer.enable_truncation(max_length=model.config.max_position_embeddings)
    encoding = tokenizer.encode(request.sentence)
    input_ids = torch.tensor([encoding.ids])
    with torch.no_grad():
        _, _, probabilities = model(input_ids, torch.tensor([encoding.type_ids]), torch.ones_like(input_ids),
                                    output_attentions=True)
    return AttentionMap(list(encoding.tokens), probabilities[request.layer][0, request.head].numpy(),
                        request.layer % layers, layers, request.head, truncated=bool(encoding.overflowing))


def _attention_request(cfg: DictConfig) -> AttentionRequest | None:
    wanted = typed_settings(cfg.report, AttentionReportConfig)
    if not wanted.attention_sentence:
        return None
    return AttentionRequest(wanted.attention_sentence, wanted.attention_layer, wanted.attention_head)



def report_upstream(cfg: DictConfig) -> tuple[str, ...]:
    """The heat-map runs the pretrained BERT on a sentence: it reads that BERT's encoder and tokenizer."""
    if _attention_request(cfg) is None or encoder_stage(cfg) not in stages_in_run(cfg):
        return ()
    return "bert_tokenizer", encoder_stage(cfg)


def report_section(cfg: DictConfig, stage_dirs: dict[str, Path], out: Path, figures: dict[str, Path]) -> list[str]:
    request = _attention_request(cfg)
    if request is None or not report_upstream(cfg):
        return []
    heat = attention_matrix(stage_dirs[encoder_stage(cfg)] / "encoder", stage_dirs["bert_tokenizer"], request,
                            typed_settings(cfg.trainer, TrainerConfig).fast_kernels)
    where = f"layer {heat.layer} of {heat.num_layers} (0-based), head {heat.head}"
    figures["attention_plot"] = out / "attention.png"
    font = font_for("".join(heat.tokens), cache_dir_of(cfg))
    plot_attention(heat.matrix, heat.tokens, figures["attention_plot"], title=f"Pretrained BERT, {where}",
                   font=font.path)
    cut = f" (its first {len(heat.tokens)} tokens: the encoder has no more positions)" if heat.truncated else ""
    return ["", "## Attention", "", f"Pretrained BERT, {where}, on “{request.sentence}”{cut}:", "",
            "![attention heat-map](attention.png)", *([""] + [font.note] if font.note else [])]
