"""Decoding a pretrained model's text, as `python -m pipeline.generate` asks for it (Family.generation): the request
(strategy and its settings) and models/generation.py's decoding of one input under it, whichever family's model, a
GPT's prompt or an encoder-decoder's source."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.generation import beam_search, greedy, sample

STRATEGIES = ("greedy", "sample", "beam")


@dataclass(frozen=True)
class Request:
    strategy: str = "greedy"
    max_new_tokens: int = 50
    beams: int = 4
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


def generate_tokens(model, ids: list[int], request: Request) -> list[list[int]]:
    """`request`'s decoding of one input by models/generation.py: the `beams` best for beam search, best first, else
    one. ValueError, one line, for what cannot be generated."""
    if request.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {request.strategy!r}; use one of {', '.join(STRATEGIES)}")
    if request.beams < 1:
        raise ValueError(f"--beams must be >= 1, got {request.beams}")
    if request.strategy == "beam":
        return [h.tokens for h in beam_search(model, ids, request.max_new_tokens, num_beams=request.beams)]
    if request.strategy == "sample":
        generator = torch.Generator().manual_seed(request.seed)
        return sample(model, [ids], request.max_new_tokens, request.temperature, request.top_k, request.top_p,
                      generator=generator)
    return greedy(model, [ids], request.max_new_tokens)


def complete_characters(text: str) -> str:
    """`text` without the replacement characters that end it: a byte-level BPE stopped after max_new_tokens can end
    inside a character of several UTF-8 bytes (a Chinese character is 3, often 2 tokens), which decodes to U+FFFD."""
    return text.rstrip("\ufffd")
