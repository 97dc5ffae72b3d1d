"""Fine-tuning on a generation task (`format: seq2seq`: a TSV of source and target texts, e.g.
tasks/bbc_headlines.yaml), whatever writes the target: the encoder-decoder (pipeline/seq2seq/downstream.py) or GPT
reading "source TL;DR:" and continuing it (pipeline/gpt/downstream.py). Dev is decoded by beam search
(models/generation.py) and scored by the task's metric (ROUGE and BLEU, pipeline/evaluation/metrics.py); the generations
of the last seed fine-tuned at the largest train size are kept in the finetune stage's `generated/<task>-<kind>.tsv`,
beside the references, and the report shows a few. What each model writes (output_summary: its most frequent
outputs, the share of distinct and of empty ones) rides on its rows, and the report tabulates it (writing_section)."""
from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig
from tokenizers import Tokenizer

from models.generation import beam_search
from pipeline.downstream.modules import FinetuneModule
from pipeline.evaluation.metrics import exact_text, score_task

GENERATED_DIR = "generated"
SAMPLE_COLUMNS = ("source", "reference", "generated")
REPORT_EXAMPLES = 5
SOURCE_WORDS = 30  # of each source the report shows
TOP_OUTPUTS = 5  # the most frequent outputs a row's output_summary keeps
OUTPUT_CHARS = 60  # of each frequent output the report shows


def complete_text(tokenizer: Tokenizer, tokens: list[int], eos: int) -> str:
    """Generated tokens as one line of text, without the end token and the replacement characters of a byte-level
    BPE cut inside a character."""
    return " ".join(tokenizer.decode([t for t in tokens if t != eos]).split()).rstrip("\ufffd")


def task_decoding(task: DictConfig) -> dict:
    """How a generation task's outputs are decoded, as its YAML says: the beam width, GNMT's length penalty, and the
    size of the n-grams no hypothesis may repeat (no_repeat_ngram_size; 0 or absent: none)."""
    return {"num_beams": int(task.num_beams), "length_penalty": float(task.length_penalty),
            "no_repeat_ngram_size": int(task.get("no_repeat_ngram_size", 0))}


def output_summary(outputs: Sequence[str], top: int = TOP_OUTPUTS) -> dict:
    """What a model writes over a split, counted by text with whitespace collapsed (case kept): how many outputs, how
    many distinct and empty ones and their shares, and the `top` most frequent with their counts (ties in the order
    first written). A model that writes one phrase for every input has a distinct share of 1/n and that phrase first,
    whatever its ROUGE."""
    counts = Counter(exact_text(text) for text in outputs)  # as exact match compares them
    n = len(outputs)
    return {"outputs": n, "distinct": len(counts), "distinct_share": round(len(counts) / n, 4) if n else 0.0,
            "empty": counts.get("", 0), "empty_share": round(counts.get("", 0) / n, 4) if n else 0.0,
            "top": [[text, count] for text, count in counts.most_common(top)]}


class GenerationModule(FinetuneModule):
    """Dev scored once, after the last epoch, on the beam-searched best continuation of every dev input (an
    encoder-decoder's source, a GPT's prompt); a subclass gives the training loss (model_step). The model's config
    names the token that ends a generation (eos_token_id)."""

    def __init__(self, model, metric: str, tokenizer: Tokenizer, dev_inputs: list[list[int]],
                 dev_sources: list[str], references: list[str], samples_path: Path, max_new_tokens: int,
                 num_beams: int, length_penalty: float, no_repeat_ngram_size: int, lr: float, weight_decay: float,
                 warmup_steps: int, total_steps: int, ignore_case: bool = False):
        super().__init__(model)
        self.save_hyperparameters("metric", "max_new_tokens", "num_beams", "length_penalty", "no_repeat_ngram_size",
                                  "lr", "weight_decay", "warmup_steps", "total_steps", "ignore_case")
        self.tokenizer, self.dev_inputs, self.dev_sources = tokenizer, dev_inputs, dev_sources
        self.references, self.samples_path = references, samples_path
        self._generated: dict[int, str] = {}

    def on_validation_epoch_start(self) -> None:
        self._generated = {}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        hp, eos = self.hparams, self.model.config.eos_token_id
        for index in batch["index"].tolist():
            best = beam_search(self.model, self.dev_inputs[index], hp.max_new_tokens, num_beams=hp.num_beams,
                               alpha=hp.length_penalty, no_repeat_ngram_size=hp.no_repeat_ngram_size)[0]
            self._generated[index] = complete_text(self.tokenizer, best.tokens, eos)

    def on_validation_epoch_end(self) -> None:
        predictions = [self._generated[i] for i in range(len(self.references))]
        self._log_scores(score_task(self.hparams.metric, predictions, self.references,
                                    ignore_case=self.hparams.ignore_case))
        self.row_fields = {"output_summary": output_summary(predictions)}
        if not self.keeps_outputs:
            return
        self.samples_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.samples_path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
            writer.writerow(SAMPLE_COLUMNS)
            writer.writerows(zip(self.dev_sources, self.references, predictions))


@dataclass
class WritingTaskModels:
    """The task models of a family that can write text (a TaskModels, pipeline/engine/family.py): its pretraining
    stage's model directory and tokenizer, the fine-tune kind, and where a generation task's texts go;
    `pretrained`: start from the weights, else from a fresh initialisation (what pretraining must beat). A family
    adds encode and build."""
    model_dir: Path
    tokenizer: Tokenizer
    kind: str
    samples_dir: Path
    pretrained: bool = True

    @property
    def encoding_key(self) -> str:
        # one encoding per kind, not one per tokenizer: a generation task's encoding names the file its texts go to
        return f"{self.model_dir}:{self.kind}"

    def samples_path(self, task_name: str) -> Path:
        return self.samples_dir / f"{task_name}-{self.kind}.tsv"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def generated_section(finetune_dir: Path) -> list[str]:
    """The report's lines for a run's generation tasks: the first dev examples as each fine-tuned model (its last
    seed at the largest train size, the headline table's: finetune.sizes_for_task runs it last) wrote them, beside the
    reference; none for a run without generation tasks."""
    by_task: dict[str, dict[str, list[dict]]] = {}
    for path in sorted((finetune_dir / GENERATED_DIR).glob("*.tsv")):
        task, kind = path.stem.rsplit("-", 1)
        with open(path, encoding="utf-8", newline="") as f:
            by_task.setdefault(task, {})[kind] = list(csv.DictReader(f, delimiter="\t"))
    lines = []
    for task, kinds in by_task.items():
        lines += ["", f"## Generated: {task}", "", f"The first {REPORT_EXAMPLES} examples scored, decoded by beam "
                  "search by each fine-tuned model (its last seed, at the largest train size), beside the "
                  "reference.", "",
                  "| source | reference | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 2) + "|"]
        first = next(iter(kinds.values()))
        for i, row in enumerate(first[:REPORT_EXAMPLES]):
            words = row["source"].split()
            source = " ".join(words[:SOURCE_WORDS]) + (" …" if len(words) > SOURCE_WORDS else "")
            lines.append(f"| {_cell(source)} | {_cell(row['reference'])} | "
                         + " | ".join(_cell(rows[i]["generated"]) for rows in kinds.values()) + " |")
    return lines


def _output_cell(text: str, count: int) -> str:
    if not text:
        return f"(empty) ×{count}"
    shown = text if len(text) <= OUTPUT_CHARS else text[:OUTPUT_CHARS - 1].rstrip() + "…"
    return f"“{_cell(shown)}” ×{count}"


def writing_section(headline: list[dict]) -> list[str]:
    """The report's lines saying what each model writes on each generation task, from the finetune stage's rows of
    `headline` (its headline_results: the largest train size) that carry an output_summary: the share of distinct and
    of empty outputs, and the most frequent outputs with their counts, for the first seed. A model that writes one
    phrase for every input shows it here, whatever its ROUGE; lead_n copies each source's first words, so its
    distinct share is the floor to set a model's beside. None for a run without such rows."""
    by_task: dict[str, dict[str, dict]] = {}
    for row in headline:  # one row per metric, each with the same summary: the first
        if "output_summary" in row:
            by_task.setdefault(row["task"], {}).setdefault(row["model"], row)
    lines = []
    for task, models in by_task.items():
        lines += ["", f"## What each model writes: {task}", "",
                  "Of each model's outputs on the scored split (its first seed; every seed's distinct share after "
                  "it), the share that are distinct and that are empty, and the most frequent outputs with their "
                  "counts. A distinct share near 1/n is one phrase written for every input; lead_n (each source's "
                  "first words) is the floor to compare with.", "",
                  "| model | seed | distinct share | empty share | most frequent outputs |", "|---|---|---|---|---|"]
        for model, row in models.items():
            summary = row["output_summary"]
            shares = row.get("distinct_share_per_seed") or []
            per_seed = f" (per seed {' / '.join(f'{v:.3f}' for v in shares)})" if len(shares) > 1 else ""
            seed = "–" if summary.get("seed") is None else summary["seed"]
            lines.append(f"| {model} | {seed} | {summary['distinct_share']:.3f} = {summary['distinct']} of "
                         f"{summary['outputs']}{per_seed} | {summary['empty_share']:.3f} = {summary['empty']} | "
                         + "; ".join(_output_cell(text, count) for text, count in summary["top"]) + " |")
    return lines
