"""The report's figures, drawn with matplotlib's Agg backend (no display on a training machine). Each function takes
plain data, writes one PNG and returns the closed Figure, whose artists tests (and callers) can still inspect."""
from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import LogFormatter, NullLocator  # noqa: E402

Curve = list[tuple[int, float]]  # (step, value)


def _save(fig: Figure, path: Path) -> Figure:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def plot_pretraining(train_loss: Curve, val_loss: Curve, val_perplexity: Curve, path: Path, title: str, *,
                     val_mlm_loss: Curve = (), unigram_loss: float | None = None,
                     accuracies: dict[str, Curve] | None = None, majority_rate: float | None = None) -> Figure:
    """Loss (train and held-out; for BERT also the held-out masked-LM loss against the unigram baseline, what token
    frequencies alone give), held-out perplexity on a log axis when the stage logs it, and held-out accuracies
    (masked LM, next sentence, with NSP's majority rate) when given."""
    accuracies = {name: curve for name, curve in (accuracies or {}).items() if curve}
    panels = 1 + bool(val_perplexity) + bool(accuracies)
    # One step axis for all panels: a perplexity measured a few times is read against the whole run.
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False, sharex=True)
    loss_ax, others = axes[0, 0], list(axes[0, 1:])
    loss_ax.plot([s for s, _ in train_loss], [v for _, v in train_loss], lw=0.8, alpha=0.6, label="train")
    if val_loss:
        loss_ax.plot([s for s, _ in val_loss], [v for _, v in val_loss], "o-", label="held-out")
    if val_mlm_loss:
        loss_ax.plot([s for s, _ in val_mlm_loss], [v for _, v in val_mlm_loss], "s-", label="held-out masked LM")
    if unigram_loss is not None:
        loss_ax.axhline(unigram_loss, color="black", ls="--", lw=1.0,
                        label=f"unigram baseline (masked LM) {unigram_loss:.2f}")
    loss_ax.set(xlabel="step", ylabel="loss (nats)", title="loss")
    loss_ax.legend(fontsize=8)
    loss_ax.grid(alpha=0.3)
    if val_perplexity:
        ppl_ax = others.pop(0)
        ppl_ax.plot([s for s, _ in val_perplexity], [v for _, v in val_perplexity], "o-", color="tab:orange")
        ppl_ax.set(xlabel="step", ylabel="perplexity (log scale)", title="held-out perplexity", yscale="log")
        # Plain numbers ("60", not "6 × 10^1"); intermediate ticks labelled only as far as they fit the span.
        ppl_ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ppl_ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ppl_ax.grid(alpha=0.3, which="both")
    if accuracies:
        acc_ax = others.pop(0)
        for name, curve in accuracies.items():
            acc_ax.plot([s for s, _ in curve], [v for _, v in curve], "o-", label=name)
        if majority_rate is not None:
            acc_ax.axhline(majority_rate, color="black", ls=":", lw=1.0,
                           label=f"next sentence: majority rate {majority_rate:.2f}")
        acc_ax.set(xlabel="step", ylabel="accuracy", title="held-out accuracy", ylim=(0.0, 1.0))
        acc_ax.legend(fontsize=8)
        acc_ax.grid(alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def _task_metrics(rows: list[dict], metrics: dict[str, str] | None) -> dict[str, str]:
    """Each task of `rows` -> the metric its figure draws: `metrics`' where it names one, else the first it reports."""
    drawn = {}
    for row in rows:
        drawn.setdefault(row["task"], (metrics or {}).get(row["task"], row["metric"]))
    return drawn


def plot_task_scores(panels: dict[str, list[dict]], path: Path, title: str,
                     metrics: dict[str, str] | None = None) -> Figure:
    """Grouped bars: one panel per results source (e.g. fine-tuning, frozen probes), one bar group per task, one bar
    per model, error bars the std over seeds. `panels` maps a panel title to rows with model, task, metric, score,
    std and seeds; each task is shown by the metric `metrics` names for it, else the first it reports (results.md has
    all of them)."""
    # Wide enough for a group of bars and a two-line label per task.
    widths = [max(5.0, 1.3 * len({r["task"] for r in rows}) + 2.0) for rows in panels.values()]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4.5), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for ax, (panel_title, rows) in zip(axes[0], panels.items()):
        headline = _task_metrics(rows, metrics)
        tasks = list(headline)
        models = list(dict.fromkeys(r["model"] for r in rows))
        by_key = {(r["model"], r["task"]): r for r in rows if r["metric"] == headline[r["task"]]}
        width = 0.8 / len(models)
        x = np.arange(len(tasks))
        for i, model in enumerate(models):
            found = [by_key.get((model, task)) for task in tasks]
            # A model missing from a task (the majority class on a regression task) leaves a gap, not a zero bar.
            # No error bar where there is no spread to show: one seed, or the (deterministic) majority class.
            bars = ax.bar(x + (i - (len(models) - 1) / 2) * width, [r["score"] if r else np.nan for r in found],
                          width, yerr=[r["std"] if r and r["seeds"] > 1 else np.nan for r in found], capsize=3,
                          label=model)
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
        ax.set_xticks(x, [f"{task}\n{headline[task]}" for task in tasks], fontsize=8)
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set(ylabel="dev score (mean ± std over seeds)", title=panel_title)
        ax.grid(axis="y", alpha=0.3)
        # Headroom above the tallest bar for the legend, so that it never covers a bar or its value label.
        bottom, top = ax.get_ylim()
        ax.set_ylim(bottom, top + 0.25 * (top - bottom))
        ax.legend(fontsize=8, loc="upper center", ncol=min(len(models), 4))
    fig.suptitle(title)
    return _save(fig, path)


def plot_label_efficiency(rows: list[dict], path: Path, title: str, dashed: tuple[str, ...] = (),
                          flat: Sequence[dict] = (), metrics: dict[str, str] | None = None) -> Figure:
    """Dev score against the number of labelled training examples (log axis), one line per model with the std over
    seeds as error bars, one panel per task (the metric `metrics` names for it, else the first it reports); the
    models in `dashed` (baselines) dashed, each of `flat` (a baseline that trains nothing, the same at every size) a
    black dotted horizontal line. Rows: model, task, metric, score, std, seeds and train_examples (the examples a run
    at that size actually had)."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    drawn = _task_metrics(rows, metrics)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        metric = drawn[task]
        mine = [r for r in rows if r["task"] == task and r["metric"] == metric]
        for model in dict.fromkeys(r["model"] for r in mine):
            points = sorted((r["train_examples"], r["score"], r["std"] if r["seeds"] > 1 else 0.0)
                            for r in mine if r["model"] == model)
            ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                        capsize=3, label=model, linestyle="--" if model in dashed else "-")
        for row in (r for r in flat if r["task"] == task and r["metric"] == metric):
            ax.axhline(row["score"], color="black", ls=":", lw=1.0,
                       label=f"{row['model']} (trains nothing, every size): {row['score']:.3f}")
        ax.set(xscale="log", xlabel="labelled training examples (log scale)",
               ylabel=f"dev {metric} (mean ± std over seeds)", title=task)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


def plot_pretrain_scaling(rows: list[dict], references: list[dict], baselines: list[dict], path: Path,
                          title: str, metrics: dict[str, str] | None = None) -> Figure:
    """Dev score against the encoder's pretraining steps (log axis), one line per model and number of labelled
    examples with the std over seeds as error bars, one panel per task (the metric `metrics` names for it, else the
    first it reports). Horizontal lines: each of
    `references` (models with no pretraining steps, e.g. the architecture from random initialisation), dashed in the
    colour of the line with its number of examples, and each of `baselines` (majority class, bag of words) in black.
    Rows: model, task, metric, score, std, seeds, train_examples, and in `rows` pretraining_steps."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    drawn = _task_metrics(rows, metrics)
    fig, axes = plt.subplots(1, len(tasks), figsize=(9 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        metric = drawn[task]
        mine = [r for r in rows if r["task"] == task and r["metric"] == metric]
        colours = {}
        for model, examples in dict.fromkeys((r["model"], r["train_examples"]) for r in mine):
            points = sorted((r["pretraining_steps"], r["score"], r["std"] if r["seeds"] > 1 else 0.0) for r in mine
                            if (r["model"], r["train_examples"]) == (model, examples))
            line = ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                               marker="o", capsize=3, label=f"{model}, {examples} examples")
            colours.setdefault(examples, line.lines[0].get_color())
        for row in (r for r in references if r["task"] == task and r["metric"] == metric):
            ax.axhline(row["score"], color=colours.get(row["train_examples"], "grey"), ls="--", lw=1.0,
                       label=f"{row['model']}, {row['train_examples']} examples: {row['score']:.3f}")
        mine_baselines = (r for r in baselines if r["task"] == task and r["metric"] == metric)
        for row, style in zip(mine_baselines, cycle([":", "-."])):
            ax.axhline(row["score"], color="black", ls=style, lw=1.0, label=f"{row['model']}: {row['score']:.3f}")
        ax.set(xscale="log", xlabel="pretraining steps of the encoder (log scale)",
               ylabel=f"dev {metric} (mean ± std over seeds)", title=task)
        steps = sorted({r["pretraining_steps"] for r in mine})
        ax.set_xticks(steps, [str(s) for s in steps])  # the steps measured, as plain numbers
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the panel: the lines span it
    fig.suptitle(title)
    return _save(fig, path)


def plot_attention(matrix: np.ndarray, tokens: Sequence[str], path: Path, title: str,
                   font: Path | None = None) -> Figure:
    """Heat-map of one head's attention: row i is how query token i spreads its attention over the key tokens; the
    tokens drawn in the font file `font` (pipeline/report/fonts.py: one with CJK glyphs), or matplotlib's default."""
    from matplotlib.font_manager import FontProperties

    size = max(4.0, 0.4 * len(tokens) + 1.5)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=float(matrix.max()))
    labels = dict(fontsize=8, fontproperties=FontProperties(fname=font, size=8) if font else None)
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, **labels)
    ax.set_yticks(range(len(tokens)), tokens, **labels)
    ax.set(xlabel="attended-to token (key)", ylabel="attending token (query)", title=title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention probability")
    return _save(fig, path)
