"""`python -m pipeline.generate RUN_DIR --prompt "..."`: continuations of a prompt by the GPT a run pretrained.

The model is the run's `gpt_pretrain` stage output, found through the RUN_DIR/gpt_pretrain link the engine writes.
Greedy by default; `--strategy sample` (--temperature, --top-k, --top-p, --seed) or `--strategy beam --beams 4`
(each of the beams' best continuations, best first; GNMT's length penalty, models/generation.py). Exit status 2, with a
one-line error, for input that cannot be generated from.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.engine.dag import MARKER, is_complete
from pipeline.gpt.samples import STAGE, STRATEGIES, Request, continuations, load_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.generate", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (outputs/...) whose pipeline ran gpt_pretrain")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--strategy", choices=STRATEGIES, default="greedy")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=50)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model_dir = args.run_dir / STAGE / "model"
    try:
        if not args.run_dir.is_dir():
            raise ValueError(f"{args.run_dir} is not a directory; pass the run directory a pipeline run printed "
                             "(run directory: outputs/<experiment>/<date>_<time>)")
        if not model_dir.is_dir():
            raise ValueError(f"{args.run_dir} has no {STAGE} stage output ({model_dir} is missing); pass the run "
                             "directory of a GPT experiment (python -m pipeline +experiment=gpt_tiny)")
        if not is_complete(args.run_dir / STAGE):
            raise ValueError(f"{args.run_dir}'s {STAGE} stage has not finished (no {MARKER}); run the pipeline again "
                             "to finish it (a killed pretraining resumes from its last checkpoint)")
        model, tokenizer = load_model(model_dir)
        texts = continuations(model, tokenizer, args.prompt, Request(
            args.strategy, args.max_new_tokens, args.beams, args.temperature, args.top_k, args.top_p, args.seed))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for i, text in enumerate(texts):
        print(f"{f'[{i + 1}] ' if len(texts) > 1 else ''}{args.prompt}{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
