"""The run's results table (results.md / results.csv) and a summary of the pretraining loss curve."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULT_COLUMNS = ["model", "task", "metric", "score", "std", "seeds"]
PRETRAINING_STAGES = ("pretrain", "elmo_pretrain", "skip_thought_pretrain")


def _loss_curve(path: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    train, val = [], []
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["name"] == "train/loss":
                train.append((int(row["step"]), float(row["value"])))
            elif row["name"] == "val/loss":
                val.append((int(row["step"]), float(row["value"])))
    return train, val


def _windowed_mean(points: list[tuple[int, float]], start: int, end: int) -> float:
    values = [v for s, v in points if start <= s <= end]
    return sum(values) / len(values) if values else float("nan")


def summarise_loss(train: list[tuple[int, float]], val: list[tuple[int, float]]) -> list[str]:
    """Markdown lines: loss at the start and the end (means over the first/last 10 % of steps), val losses."""
    if not train:
        return ["No pretraining loss was recorded."]
    last_step = train[-1][0]
    window = max(1, last_step // 10)
    first, final = _windowed_mean(train, 0, window), _windowed_mean(train, last_step - window, last_step)
    lines = [f"- train loss: {first:.3f} over steps 0–{window} → {final:.3f} over steps "
             f"{last_step - window}–{last_step} ({len(train)} steps logged)"]
    if val:
        lines.append("- held-out loss: " + ", ".join(f"{v:.3f} @ {s}" for s, v in val))
    return lines


def plot_loss(train, val, path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _ in train], [v for _, v in train], lw=0.8, alpha=0.6, label="train")
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _score(row: dict) -> str:
    return f"{row['score']:.4f} ± {row['std']:.4f}" if row["seeds"] > 1 else f"{row['score']:.4f}"


def _pivot(rows: list[dict]) -> list[str]:
    """Markdown table, one row per encoder and one column per task metric (SentEval's layout)."""
    columns = list(dict.fromkeys(f"{r['task']} {r['metric']}" for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    cell = {(r["model"], f"{r['task']} {r['metric']}"): f"{r['score']:.4f}" for r in rows}
    return ["| encoder | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"] + \
        [f"| {m} | " + " | ".join(cell.get((m, c), "–") for c in columns) + " |" for m in models]


def write_report(stage_dirs: dict[str, Path], out: Path, title: str) -> dict[str, Path]:
    """results.md / results.csv (one row per model, task and metric) from the finetune and evaluate stages, and the
    pretraining loss curve (summary and plot) from the pretrain stage."""
    lines = [f"# Results: {title}"]
    rows = []
    for stage, heading in (("finetune", "Fine-tuning (dev set)"), ("evaluate", "Frozen sentence embeddings (SentEval-style probes)")):
        if stage not in stage_dirs:
            continue
        results = json.loads((stage_dirs[stage] / "results.json").read_text())
        rows += [{"stage": stage, **r} for r in results]
        lines += ["", f"## {heading}", ""]
        if stage == "finetune":
            lines += ["| model | task | metric | score | seeds |", "|---|---|---|---|---|"]
            lines += [f"| {r['model']} | {r['task']} | {r['metric']} | {_score(r)} | {r['seeds']} |" for r in results]
        else:
            lines += _pivot(results)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["stage", *RESULT_COLUMNS], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    paths = {"results_md": out / "results.md", "results_csv": out / "results.csv"}
    for stage in PRETRAINING_STAGES:
        if stage not in stage_dirs:
            continue
        train, val = _loss_curve(stage_dirs[stage] / "loss_curve.csv")
        lines += ["", f"## Pretraining ({stage})", ""] + summarise_loss(train, val)
        info = json.loads((stage_dirs[stage] / "stage.json").read_text())
        lines += [f"- {info.get('steps')} steps in {info.get('duration_s')} s, precision {info.get('precision')}, "
                  f"{info.get('num_parameters')} parameters"]
        if train:
            plot_loss(train, val, out / f"{stage}_loss.png", title=f"Pretraining loss ({stage})")
            lines += ["", f"![{stage} loss]({stage}_loss.png)"]
            paths[f"{stage}_loss_plot"] = out / f"{stage}_loss.png"
    (out / "results.md").write_text("\n".join(lines) + "\n")
    return paths
