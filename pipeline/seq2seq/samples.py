"""The report's section of the seq2seq family: a few of the fine-tuned models' generations (beam search, the last
seed fine-tuned) beside the references, for each generation task of the run."""
from __future__ import annotations

import csv
from pathlib import Path

from omegaconf import DictConfig

from pipeline.seq2seq.downstream import FINETUNE_KINDS, GENERATED_DIR

REPORT_EXAMPLES = 5
SOURCE_WORDS = 30  # of each source shown


def report_upstream(cfg: DictConfig) -> tuple[str, ...]:
    kinds = set(cfg.finetune.models) & set(FINETUNE_KINDS)
    return ("finetune",) if kinds and "finetune" in cfg.pipeline.stages else ()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def report_section(cfg: DictConfig, stage_dirs: dict[str, Path], out: Path, figures: dict[str, Path]) -> list[str]:
    if not report_upstream(cfg):
        return []
    by_task: dict[str, dict[str, list[dict]]] = {}
    for path in sorted((stage_dirs["finetune"] / GENERATED_DIR).glob("*.tsv")):
        task, kind = path.stem.rsplit("-", 1)
        with open(path, encoding="utf-8", newline="") as f:
            by_task.setdefault(task, {})[kind] = list(csv.DictReader(f, delimiter="\t"))
    lines = []
    for task, kinds in by_task.items():
        lines += ["", f"## Generated: {task}", "", f"The first {REPORT_EXAMPLES} dev examples, decoded by beam search "
                  "by each fine-tuned model (its last seed), beside the reference.", "",
                  "| source | reference | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 2) + "|"]
        first = next(iter(kinds.values()))
        for i, row in enumerate(first[:REPORT_EXAMPLES]):
            words = row["source"].split()
            source = " ".join(words[:SOURCE_WORDS]) + (" …" if len(words) > SOURCE_WORDS else "")
            lines.append(f"| {_cell(source)} | {_cell(row['reference'])} | "
                         + " | ".join(_cell(rows[i]["generated"]) for rows in kinds.values()) + " |")
    return lines
