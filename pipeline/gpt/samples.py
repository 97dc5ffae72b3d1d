"""Text from a run's pretrained GPT: what `python -m pipeline.generate` prints, and the report's section of greedy
continuations of fixed prompts."""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig
from tokenizers import Tokenizer

from data_prep.examples.gpt_blocks import load_gpt_tokenizer
from models.gpt import GPTLMHeadModel
from models.hf.gpt import load_ours_or_hf
from models.kernels import use_fast_kernels
from pipeline.engine.generation import Request, complete_characters, generate_tokens
from pipeline.engine.settings import stages_in_run, typed_settings
from pipeline.engine.training import TrainerConfig
from pipeline.gpt.settings import GptReportConfig

STAGE = "gpt_pretrain"
REPORT_NEW_TOKENS = 30  # of each of report.gpt_prompts' continuations


def load_model(model_dir: Path, fast_kernels: bool = True) -> tuple[GPTLMHeadModel, Tokenizer]:
    """The GPT to decode with, with models/kernels.py's decoding kernels where `fast_kernels` (trainer.fast_kernels
    in a run, --no-fast-kernels of pipeline.generate)."""
    model = load_ours_or_hf(model_dir).eval()
    return use_fast_kernels(model) if fast_kernels else model, load_gpt_tokenizer(model_dir)


def continuations(model: GPTLMHeadModel, tokenizer: Tokenizer, prompt: str, request: Request) -> list[str]:
    """The continuation of `prompt` (the `beams` best for beam search, best first) as text, without the
    end-of-text token that ends a finished one. ValueError, one line, for what cannot be generated."""
    if not prompt.strip():
        raise ValueError("the prompt is empty: give some text to continue")
    eos = model.config.eos_token_id
    return [complete_characters(tokenizer.decode([t for t in tokens if t != eos]))
            for tokens in generate_tokens(model, tokenizer.encode(prompt).ids, request)]


def continue_texts(model_dir: Path, prompts: list[str], request: Request, fast_kernels: bool) -> list[list[str]]:
    """Each prompt's continuations by the GPT in `model_dir` (Generation.write)."""
    model, tokenizer = load_model(model_dir, fast_kernels)
    return [continuations(model, tokenizer, prompt, request) for prompt in prompts]


def report_upstream(cfg: DictConfig) -> tuple[str, ...]:
    return (STAGE,) if STAGE in stages_in_run(cfg) else ()


def report_section(cfg: DictConfig, stage_dirs: dict[str, Path], out: Path, figures: dict[str, Path]) -> list[str]:
    if not report_upstream(cfg):
        return []
    model, tokenizer = load_model(stage_dirs[STAGE] / "model", typed_settings(cfg.trainer, TrainerConfig).fast_kernels)
    lines = ["", "## GPT samples", "", f"Greedy continuations ({REPORT_NEW_TOKENS} tokens at most) by the pretrained "
             "GPT; `python -m pipeline.generate RUN_DIR --prompt ...` for more.", ""]
    for prompt in typed_settings(cfg.report, GptReportConfig).gpt_prompts:
        room = model.config.n_positions - len(tokenizer.encode(prompt).ids)
        if room < 1:
            lines.append(f"- **{prompt}** (not continued: the prompt fills the {model.config.n_positions}-token "
                         "context)")
            continue
        (text,) = continuations(model, tokenizer, prompt, Request(max_new_tokens=min(REPORT_NEW_TOKENS, room)))
        one_line = re.sub(r"\s+", " ", text)  # the leading space, if any, kept: it is the model's
        lines.append(f"- **{prompt}**{one_line}")
    return lines
