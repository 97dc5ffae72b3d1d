"""`python -m pipeline.generate RUN_DIR --prompt "..."`: continuations of a prompt by the GPT a run pretrained;
`--input "..."`: the output of the encoder-decoder a run pretrained (seq2seq family) for that source text.

The model is the run's `gpt_pretrain` (or `seq2seq_pretrain`) stage output, found through the RUN_DIR/<stage> link the
engine writes.
Greedy by default; `--strategy sample` (--temperature, --top-k, --top-p, --seed) or `--strategy beam --beams 4`
(each of the beams' best continuations, best first; GNMT's length penalty, models/generation.py). Exit status 2, with a
one-line error, for input that cannot be generated from.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer
from models.kernels import use_fast_kernels
from pipeline.engine.dag import MARKER, is_complete
from pipeline.gpt.samples import (
    STAGE,
    STRATEGIES,
    Request,
    complete_characters,
    continuations,
    generate_tokens,
    load_model,
)
from pipeline.seq2seq.architectures import load_model as load_seq2seq

SEQ2SEQ_STAGE = "seq2seq_pretrain"


def seq2seq_outputs(model_dir: Path, text: str, request: Request, fast_kernels: bool = True) -> list[str]:
    """The pretrained encoder-decoder's outputs for the source `text` (ended by the end token, as its sources are),
    decoded with models/kernels.py's kernels where `fast_kernels`."""
    if not text.strip():
        raise ValueError("the input is empty: give some text to generate from")
    model, tokenizer = load_seq2seq(model_dir).eval(), load_seq2seq_tokenizer(model_dir)
    if fast_kernels:
        use_fast_kernels(model)
    eos = model.config.eos_token_id
    ids = [*tokenizer.encode(text).ids[: model.config.max_positions - 1], eos]
    return [complete_characters(tokenizer.decode([t for t in tokens if t != eos]))
            for tokens in generate_tokens(model, ids, request)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.generate", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (outputs/...) whose pipeline ran gpt_pretrain "
                                                     "(--prompt) or seq2seq_pretrain (--input)")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="text for a GPT to continue")
    given.add_argument("--input", help="a source text for an encoder-decoder (seq2seq) to write its output from")
    parser.add_argument("--strategy", choices=STRATEGIES, default="greedy")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=50)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-fast-kernels", dest="fast_kernels", action="store_false",
                        help="decode with the model as models/ writes it, without models/kernels.py's kernels (the "
                             "same outputs to float rounding, slower)")
    args = parser.parse_args(argv)
    stage = STAGE if args.prompt is not None else SEQ2SEQ_STAGE
    model_dir = args.run_dir / stage / "model"
    try:
        if not args.run_dir.is_dir():
            raise ValueError(f"{args.run_dir} is not a directory; pass the run directory a pipeline run printed "
                             "(run directory: outputs/<experiment>/<date>_<time>)")
        if not model_dir.is_dir():
            experiment = "gpt_tiny" if stage == STAGE else "seq2seq_tiny"
            raise ValueError(f"{args.run_dir} has no {stage} stage output ({model_dir} is missing); pass the run "
                             f"directory of such an experiment (python -m pipeline +experiment={experiment})"
                             + (", or --input for a seq2seq run" if stage == STAGE else ", or --prompt for a GPT run"))
        if not is_complete(args.run_dir / stage):
            raise ValueError(f"{args.run_dir}'s {stage} stage has not finished (no {MARKER}); run the pipeline again "
                             "to finish it (a killed pretraining resumes from its last checkpoint)")
        request = Request(args.strategy, args.max_new_tokens, args.beams, args.temperature, args.top_k, args.top_p,
                          args.seed)
        if stage == STAGE:
            model, tokenizer = load_model(model_dir, args.fast_kernels)
            texts = continuations(model, tokenizer, args.prompt, request)
        else:
            texts = seq2seq_outputs(model_dir, args.input, request, args.fast_kernels)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for i, text in enumerate(texts):
        print(f"{f'[{i + 1}] ' if len(texts) > 1 else ''}{args.prompt or ''}{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
