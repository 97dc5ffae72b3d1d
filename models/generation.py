"""
Decoding with a KV cache: greedy, sampling (temperature, top-k, top-p) and beam search, for the decoder-only GPT
(models/gpt.py: continuing a prompt) and the encoder-decoders (models/seq2seq.py, models/rnn_seq2seq.py: writing a
target for a source) alike.

Inputs (a GPT's prompts, an encoder-decoder's sources) and continuations are lists of token ids; a continuation ends
with the model's eos_token_id when the model produced it, and is at most max_new_tokens long. The model runs in eval
mode (no dropout) and without gradients, and is left in the mode it was in.

The loops below see a model only through a Decoding: the rows being decoded, each step feeding them their next tokens
and reading the scores of the token after. An encoder-decoder makes its own (`start_decoding`); GPT's is built here.
"""

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from models.gpt import GPTLMHeadModel


class Decoding(Protocol):
    """A batch of rows being decoded, whatever the model."""

    eos_token_id: int | None  # the token that ends a row; None: rows run to max_new_tokens

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T): each row's next tokens, appended to its state (its KV cache). Returns the scores (B, V) of
        the token after them: logits, whose log_softmax the loops take, or log-probabilities, their own log_softmax (a
        copying encoder-decoder's mixture, models.seq2seq.PointerGenerator)."""

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i becomes the old row rows[i] (beam search keeping, and duplicating, the surviving beams' pasts)."""


def check_request(model: GPTLMHeadModel, prompt_lengths: Sequence[int], max_new_tokens: int) -> None:
    """One-line ValueErrors, naming the argument, for what no decoding of a GPT can serve."""
    n_positions = model.config.n_positions
    if not prompt_lengths:
        raise ValueError("prompts is empty: give at least one prompt")
    if min(prompt_lengths) == 0:
        raise ValueError("prompt is empty: give at least one token (GPT-2 starts a document with <|endoftext|>)")
    longest = max(prompt_lengths)
    if longest > n_positions:
        raise ValueError(f"prompt of {longest} tokens is longer than the model's context n_positions={n_positions}; "
                         f"keep its last {n_positions} tokens")
    if longest + max_new_tokens > n_positions:
        raise ValueError(f"max_new_tokens={max_new_tokens} after a prompt of {longest} tokens runs past the model's "
                         f"context n_positions={n_positions}; ask for at most {n_positions - longest}")


class GPTDecoding:
    """A GPT's prompts being continued, with its KV cache."""

    def __init__(self, model: GPTLMHeadModel, cache):
        self.model, self.cache, self.eos_token_id = model, cache, model.config.eos_token_id

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.next_token_logits(tokens, self.cache)

    def reorder(self, rows: torch.Tensor) -> None:
        self.cache.reorder(rows)


def _start_gpt(model: GPTLMHeadModel, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               num_rows: int) -> tuple[GPTDecoding, torch.Tensor]:
    """GPT's Decoding of `prompts` with room for num_rows rows, and the first tokens to feed it: the prompts,
    left-padded when unequal, so that every row's newest token sits in the last column (KVCache.pad)."""
    if prompts and isinstance(prompts[0], int):
        raise ValueError("prompts is a list of prompts, each a list of token ids: wrap a single prompt as [prompt]")
    check_request(model, [len(p) for p in prompts], max_new_tokens)
    device = model.transformer.wte.weight.device
    T = max(len(p) for p in prompts)
    pad = torch.tensor([T - len(p) for p in prompts], device=device)
    idx = torch.tensor([[0] * (T - len(p)) + list(p) for p in prompts], device=device)  # (B, T)
    cache = model.new_cache(max(num_rows, len(prompts)), T + max_new_tokens, pad if bool(pad.any()) else None)
    return GPTDecoding(model, cache), idx


def start_decoding(model, inputs: Sequence[Sequence[int]], max_new_tokens: int,
                   num_rows: int) -> tuple[Decoding, torch.Tensor]:
    """The Decoding of `inputs` (a GPT's prompts, an encoder-decoder's sources) with room for num_rows rows and
    max_new_tokens new tokens, and the tokens (B, T) its first step takes; one-line ValueErrors for what no decoding
    can serve. Run under torch.no_grad: an encoder-decoder encodes the sources here."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if isinstance(model, GPTLMHeadModel):
        return _start_gpt(model, inputs, max_new_tokens, num_rows)
    return model.start_decoding(inputs, max_new_tokens, num_rows)


@contextlib.contextmanager
def _inference(model: torch.nn.Module):
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


# -----------------------------------------------------------------------------
# Greedy and sampling: one token per prompt and step, a batch of prompts at once


def _decode(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
            choose: Callable[[torch.Tensor], torch.Tensor]) -> list[list[int]]:
    """The continuation of every input, each next token chosen by `choose` from the logits (B, V) -> (B,)."""
    with _inference(model):
        decoding, first = start_decoding(model, prompts, max_new_tokens, len(prompts))
        eos = decoding.eos_token_id
        logits = decoding.step(first)  # (B, V)
        chosen, finished = [], torch.zeros(len(prompts), dtype=torch.bool, device=first.device)
        for step in range(max_new_tokens):
            next_ids = choose(logits.float())  # (B,)
            chosen.append(next_ids)
            if eos is not None:
                finished |= next_ids == eos
                if bool(finished.all()):
                    break
            if step + 1 < max_new_tokens:
                logits = decoding.step(next_ids[:, None])
    out = torch.stack(chosen, 1).tolist() if chosen else [[] for _ in prompts]  # (B, steps)
    return [row[: row.index(eos) + 1] if eos in row else row for row in out]


def greedy(model, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """The most likely next token at every step, for each prompt (a GPT's) or source (an encoder-decoder's)."""
    return _decode(model, prompts, max_new_tokens, lambda logits: logits.argmax(-1))


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """logits (B, V) with every token outside the top-k, and outside the top-p nucleus, set to -inf. The nucleus
    (Holtzman et al. 2020) is the smallest set of most likely tokens whose probability reaches p; the most likely
    token is always kept. Applied in this order, as in HF's generate."""
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        outside = probs.cumsum(-1) - probs >= top_p  # the tokens ranked above already reach p
        logits = logits.masked_fill(torch.zeros_like(outside).scatter(-1, order, outside), float("-inf"))
    return logits


def sample(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> list[list[int]]:
    """Ancestral sampling from softmax(logits / temperature), restricted to the top-k tokens and/or the top-p nucleus.
    Draws come from `generator` (on the model's device) when given, so a seeded generator reproduces the samples
    without touching the global RNG."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature} (greedy() is the temperature -> 0 limit)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")

    def choose(logits):
        probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return _decode(model, prompts, max_new_tokens, choose)


# -----------------------------------------------------------------------------
# Beam search


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14): a hypothesis scores log P(Y) / lp(Y), so with
    alpha > 0 longer ones are penalised less than by log P alone (which falls with every token); alpha = 0 ranks by
    log P. Wu et al. found alpha in [0.6, 0.7] best. The +5 keeps the penalty gentle for the shortest hypotheses, where
    |Y|^alpha (HF's form) would change most."""
    return ((5 + length) / 6) ** alpha


@dataclass
class Hypothesis:
    tokens: list[int]  # the continuation, ending with eos_token_id when finished
    log_prob: float  # log P(tokens | prompt)
    score: float  # log_prob / length_penalty(len(tokens), alpha): what beam search maximises
    finished: bool  # ended with eos_token_id; else cut at max_new_tokens


def repeated_ngram_tokens(tokens: Sequence[int], n: int) -> list[int]:
    """The tokens that, appended to `tokens`, would repeat an n-gram already in them: what n-gram blocking forbids
    (Paulus et al. 2018's trigram blocking; HF's no_repeat_ngram_size). n <= 0 blocks nothing."""
    if n <= 0 or len(tokens) < n:
        return []
    prefix = tuple(tokens[len(tokens) - n + 1:])
    return [tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i:i + n - 1]) == prefix]


def beam_search(model, prompt: Sequence[int], max_new_tokens: int, num_beams: int = 4, alpha: float = 0.6,
                early_stopping: bool = False, no_repeat_ngram_size: int = 0) -> list[Hypothesis]:
    """The num_beams best continuations of one prompt (a GPT's) or source (an encoder-decoder's) found by beam search,
    best first: the n-best list.

    At each step every live beam is extended by every token, and the best 2 * num_beams extensions by log P are read
    in order (as in HF's and fairseq's beam search): one ending with eos_token_id becomes a finished hypothesis if it
    ranks among the first num_beams, as a beam of that width would have kept it (the best num_beams finished ones are
    kept); the others become the next live beams until there are num_beams of them. Search stops once num_beams
    hypotheses have finished and no live beam can still beat the worst of them (its log P can only fall, and its
    length penalty can grow at most to that of the next or of the longest allowed length, whichever is larger), or
    after max_new_tokens, when the live beams join the finished ones as unfinished hypotheses. early_stopping=True
    stops as soon as num_beams hypotheses have finished (HF's early_stopping=True, fairseq's default), cheaper and
    possibly worse. With num_beams=1 and alpha=0 (or no eos_token_id) this is greedy decoding. no_repeat_ngram_size=n
    > 0: no hypothesis repeats an n-gram of its own continuation (the prompt or source may be copied), the remedy
    for the loops a small model's beams fall into ("face face face").
    """
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    finished: list[Hypothesis] = []
    with _inference(model):
        decoding, first = start_decoding(model, [prompt], max_new_tokens, num_beams)
        device, eos = first.device, decoding.eos_token_id
        beams, beam_log_probs = [[]], torch.zeros(1, device=device)  # the live beams' tokens and log P, best first
        logits = decoding.step(first)  # (1, V)
        for step in range(1, max_new_tokens + 1):
            log_probs = logits.float().log_softmax(-1)  # (n, V)
            if no_repeat_ngram_size > 0:  # off: no per-beam work in the decoding loop
                for row, beam in enumerate(beams):
                    log_probs[row, repeated_ngram_tokens(beam, no_repeat_ngram_size)] = float("-inf")
            candidates = beam_log_probs[:, None] + log_probs  # (n, V)
            top, flat = candidates.flatten().topk(min(2 * num_beams, candidates.numel()))
            kept = []  # (row, token, log P) of the next live beams
            for rank, (log_prob, i) in enumerate(zip(top.tolist(), flat.tolist())):
                if log_prob == float("-inf"):  # blocked: so is every extension after it
                    break
                row, token = divmod(i, candidates.size(1))
                if token != eos:
                    if len(kept) < num_beams:
                        kept.append((row, token, log_prob))
                elif rank < num_beams:
                    finished.append(Hypothesis(beams[row] + [token], log_prob,
                                               log_prob / length_penalty(step, alpha), True))
            finished = sorted(finished, key=lambda h: h.score, reverse=True)[:num_beams]
            beams = [beams[row] + [token] for row, token, _ in kept]
            beam_log_probs = torch.tensor([log_prob for *_, log_prob in kept], device=device)
            if not beams or step == max_new_tokens:
                break
            if len(finished) == num_beams:
                most_lenient = max(length_penalty(step + 1, alpha), length_penalty(max_new_tokens, alpha))
                if early_stopping or kept[0][2] / most_lenient <= finished[-1].score:
                    beams = []
                    break
            decoding.reorder(torch.tensor([row for row, *_ in kept], device=device))
            logits = decoding.step(torch.tensor([[token] for _, token, _ in kept], device=device))
    unfinished = [Hypothesis(tokens, log_prob, log_prob / length_penalty(len(tokens), alpha), False)
                  for tokens, log_prob in zip(beams, beam_log_probs.tolist())]
    return sorted(finished + unfinished, key=lambda h: h.score, reverse=True)[:num_beams]
