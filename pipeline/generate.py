"""`python -m pipeline.generate RUN_DIR --prompt "..."`: text from a model a run pretrained, for one text: a GPT's
continuations of it, an encoder-decoder's output from it as its source; `--input FILE`: for each line of FILE, one line
of output (the best).

The families whose models write text say so in their record (Family.generation: the pretraining stage, how it writes);
the model is that stage's output, found through the RUN_DIR/<stage> link the engine writes, and `--family` picks one
where the run trained several (seq2seq_tiny trains its GPT baseline beside the encoder-decoder).
Greedy by default; `--strategy sample` (--temperature, --top-k, --top-p, --seed) or `--strategy beam --beams 4`
(each of the beams' best outputs, best first, for --prompt; GNMT's length penalty, models/generation.py). Exit status
2, with a one-line error, for input that cannot be generated from.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.engine.dag import MARKER, is_complete
from pipeline.engine.family import Family
from pipeline.engine.generation import STRATEGIES, Request
from pipeline.families import FAMILIES

WRITERS = {family.name: family for family in FAMILIES if family.generation}


def chosen_family(run_dir: Path, name: str | None) -> Family:
    """The family whose model writes the run's text: `name` (--family), else the only one the run trained."""
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is not a directory; pass the run directory a pipeline run printed "
                         "(run directory: outputs/<experiment>/<date>_<time>)")
    if name is not None:
        family = WRITERS[name]
        if not (run_dir / family.generation.stage).exists():
            raise ValueError(f"{run_dir} has no {family.generation.stage} stage output; pass the run directory of "
                             f"such an experiment (python -m pipeline +experiment={family.generation.experiment})")
        return family
    trained = [family for family in WRITERS.values() if (run_dir / family.generation.stage).exists()]
    if not trained:
        stages = ", ".join(family.generation.stage for family in WRITERS.values())
        experiments = " or ".join(f"+experiment={family.generation.experiment}" for family in WRITERS.values())
        raise ValueError(f"{run_dir} has no output of a stage that writes text ({stages}); pass the run directory of "
                         f"such an experiment (python -m pipeline {experiments})")
    if len(trained) > 1:
        raise ValueError(f"{run_dir} trained several models that write text "
                         f"({', '.join(f'{f.name}: {f.generation.stage}' for f in trained)}); pick one with "
                         + " or ".join(f"--family {f.name}" for f in trained))
    return trained[0]


def read_inputs(path: Path) -> list[str]:
    """The texts of --input FILE, one a line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--input {path} cannot be read ({err}); pass a UTF-8 text file, one input a line") from None
    if not lines:
        raise ValueError(f"--input {path} is empty; give one input a line")
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if empty:
        raise ValueError(f"line {empty[0]} of --input {path} is empty; give one input a line, with no blank lines")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.generate", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (outputs/...) whose pipeline pretrained a model "
                                                     f"that writes text ({', '.join(WRITERS)})")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="one text to generate from: a GPT continues it, an encoder-decoder reads it "
                                        "as its source")
    given.add_argument("--input", type=Path, help="a file of texts, one a line: one line of output each")
    parser.add_argument("--family", choices=sorted(WRITERS),
                        help="the family whose model writes, where the run trained several")
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
    try:
        generation = chosen_family(args.run_dir, args.family).generation
        stage_dir = args.run_dir / generation.stage
        if not is_complete(stage_dir):
            raise ValueError(f"{args.run_dir}'s {generation.stage} stage has not finished (no {MARKER}); run the "
                             "pipeline again to finish it (a killed pretraining resumes from its last checkpoint)")
        texts = [args.prompt] if args.prompt is not None else read_inputs(args.input)
        request = Request(args.strategy, args.max_new_tokens, args.beams, args.temperature, args.top_k, args.top_p,
                          args.seed)
        outputs = generation.write(stage_dir / "model", texts, request, args.fast_kernels)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for text, written in zip(texts, outputs):
        shown = [f"{text if generation.continues else ''}{output}" for output in written]
        if args.prompt is not None:
            for i, line in enumerate(shown):
                print(f"{f'[{i + 1}] ' if len(shown) > 1 else ''}{line}")
        else:  # the best, kept on one line: the output's lines are the input's
            print(" ".join(shown[0].splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
