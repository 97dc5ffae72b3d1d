"""The run's report: results.md / results.csv / results.json (one row per model, task and metric), pretraining
loss and perplexity curves, a bar chart of task scores per model and the sections the families add (BERT's attention
heat-map); all logged to the report stage's W&B run as well when it has one.

One file of ~430 lines: one stage's tables and the sections they share; its plots are already apart
(pipeline/report/plots.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable

from data_prep.corpus.shards import MANIFEST_NAME, write_json_atomically
from pipeline.downstream.finetune import (
    BASELINES,
    FLAT_BASELINES,
    MODEL_KINDS,
    SNAPSHOT_MARK,
    SUBSET_BASELINES,
    headline_results,
    is_snapshot,
    label_efficiency,
    pretraining_scaling,
)
from pipeline.downstream.generation import generated_section, writing_section
from pipeline.evaluation.metrics import FIGURE_METRICS
from pipeline.evaluation.stage import ENCODERS
from pipeline.report.plots import (
    Curve,
    plot_label_efficiency,
    plot_pretrain_scaling,
    plot_pretraining,
    plot_task_scores,
)
from pipeline.status import human_bytes

RESULT_COLUMNS = ["model", "task", "metric", "score", "std", "seeds", "train_size", "train_examples"]
RESULT_STAGES = {"finetune": "Fine-tuning (dev set)", "evaluate": "Frozen sentence embeddings (SentEval-style probes)"}
# The settings that leave a result stage nothing to score when empty
NOTHING_TO_SCORE = {"finetune": "finetune.models and finetune.baselines",
                    "evaluate": "evaluate.encoders and senteval.tasks"}
# Held-out perplexity as each family logs it: BERT's masked-LM perplexity, ELMo's biLM perplexity (mean of the two
# directions). Skip-Thought logs none.
PERPLEXITY_NAMES = ("val/mlm_perplexity", "val/perplexity")



def read_curves(path: Path) -> dict[str, Curve]:
    """metric name -> [(step, value)] from a stage's loss_curve.csv (pipeline.engine.training.LossHistory)."""
    curves: dict[str, Curve] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            curves.setdefault(row["name"], []).append((int(row["step"]), float(row["value"])))
    return curves


def _windowed_mean(points: Curve, start: int, end: int) -> float:
    values = [v for s, v in points if start <= s <= end]
    return sum(values) / len(values) if values else float("nan")


def summarise_loss(train: Curve, val: Curve) -> list[str]:
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



def _score(row: dict) -> str:
    if row["seeds"] == 0:  # no seed's score is defined (a correlation of constant predictions)
        return "undefined"
    return f"{row['score']:.4f} ± {row['std']:.4f}" if row["seeds"] > 1 else f"{row['score']:.4f}"


def _pivot(rows: list[dict]) -> list[str]:
    """Markdown table, one row per encoder and one column per task metric (SentEval's layout)."""
    columns = list(dict.fromkeys(f"{r['task']} {r['metric']}" for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    cell = {(r["model"], f"{r['task']} {r['metric']}"): f"{r['score']:.4f}" for r in rows}
    return ["| encoder | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"] + \
        [f"| {m} | " + " | ".join(cell.get((m, c), "–") for c in columns) + " |" for m in models]


def _scored_on(results: list[dict]) -> str:
    """The split a stage's rows were scored on: train_holdout (finetune.selection_fraction), test
    (finetune.score_split=test) or dev."""
    return next((split for split in ("train_holdout", "test") if any(r.get("scored_on") == split for r in results)),
                "dev")


def probes_without_data(evaluate_dir: Path) -> dict[str, str]:
    """The probe tasks an evaluate stage skipped for want of data (name -> the path it looked for), from its summary;
    none for a run older than that record."""
    path = evaluate_dir / "stage.json"
    return json.loads(path.read_text()).get("tasks_without_data", {}) if path.is_file() else {}


def probes_not_run(tasks_without_data: dict[str, str]) -> list[str]:
    """The probe tasks the evaluate stage skipped for want of data (name -> the path it looked for), said above its
    table: a table without SICK's columns must not pass for a complete one."""
    if not tasks_without_data:
        return []
    skipped = "; ".join(f"{name} (no data at {path})" for name, path in tasks_without_data.items())
    return [f"**Not run**: {skipped}. To run them, set TEXTREP_SHARED_DATA (or senteval.data_root) to the directory "
            "holding their data (docs/usage.md).", ""]


def _results_section(stage: str, results: list[dict], tasks_without_data: dict[str, str]) -> list[str]:
    heading, scored_on = RESULT_STAGES[stage], _scored_on(results)
    if scored_on == "train_holdout":
        heading = "Fine-tuning (held-out part of the train split, finetune.selection_fraction; not the dev set)"
    elif scored_on == "test":
        heading = "Fine-tuning (test set, finetune.score_split=test)"
    lines = ["", f"## {heading}", "", *probes_not_run(tasks_without_data)]
    if not results:
        return lines + [f"No results: the stage scored nothing (see {NOTHING_TO_SCORE[stage]})."]
    if stage == "finetune":
        headline = headline_results(results)
        lines += ["| model | task | metric | score | seeds | per seed | train examples |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {_model_cell(r)} | {r['task']} | {r['metric']} | {_score(r)} | {r['seeds']} | "
                  f"{' / '.join('–' if v is None else f'{v:.4f}' for v in r.get('per_seed') or [])} | "
                  f"{r.get('train_examples', '–')} |" for r in headline]
        warnings = dict.fromkeys(r["coverage_warning"] for r in headline if r.get("coverage_warning"))
        notes = ["", *(f"**WARNING**: {warning}" for warning in warnings)] if warnings else []
        return lines + notes + pretrained_vs_random(headline)
    return lines + _pivot(results) + pair_features_lines(results) + frozen_vs_random(results)


def _model_cell(row: dict) -> str:
    """A row's model, with the share of the task's words a baseline covers where it reports one (w2v_mean), or a
    model kind's coverage of the task's tokens where it reports one (finetune.token_coverage_fields)."""
    if "coverage" in row:
        low = "; BELOW finetune.w2v_min_coverage: not a real baseline" if row.get("coverage_warning") else ""
        return f"{row['model']} (covers {row['coverage']:.0%} of the task's words{low})"
    if "token_coverage" in row:
        tokens = row["token_coverage"]
        parts = [f"{tokens['unknown_token']} {tokens['unknown_rate']:.1%} of the task's tokens"
                 + (", ABOVE finetune.max_unknown_rate" if tokens["high_unknown_rate"] else "")]
        if "vectors" in tokens:
            parts.append(f"{tokens['vectors']} cover {tokens['vector_coverage']:.0%}"
                         + (", BELOW finetune.w2v_min_coverage" if tokens["low_vector_coverage"] else ""))
        return f"{row['model']} ({'; '.join(parts)})"
    return row["model"]


def pair_features_lines(results: list[dict]) -> list[str]:
    """Which features the sentence-pair tasks' classifiers saw: SentEval's [abs_diff, product] and InferSent's
    [u, v, abs_diff, product] give different scores, so a table is comparable only with one built the same way."""
    used: dict[tuple, list[str]] = {}
    for row in results:
        if row.get("pair_features"):
            tasks = used.setdefault(tuple(row["pair_features"]), [])
            if row["task"] not in tasks:
                tasks.append(row["task"])
    return ["", *(f"- pair features of {', '.join(tasks)}: [{', '.join(names)}] (senteval.pair_features)"
                  for names, tasks in used.items())] if used else []


def frozen_vs_random(rows: list[dict]) -> list[str]:
    """One line per probed encoder whose random twin (EncoderSpec.random_twin) is in the table too: the difference on
    every task metric, and in plain words the probes where pretraining gave nothing over the random architecture."""
    score = {(r["model"], f"{r['task']} {r['metric']}"): r["score"] for r in rows}
    columns = list(dict.fromkeys(f"{r['task']} {r['metric']}" for r in rows))
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        twin = ENCODERS[model].random_twin if model in ENCODERS else None
        differences = [(c, score[model, c] - score[twin, c]) for c in columns
                       if (model, c) in score and (twin, c) in score]
        if not differences:
            continue
        behind = [c for c, difference in differences if difference <= 0]
        verdict = (f"ahead on all {len(differences)}" if not behind else
                   f"NOT ahead on {len(behind)} of {len(differences)} ({', '.join(behind)}): there the pretraining "
                   "gave nothing over the random architecture")
        lines.append(f"- {model} - {twin}: " + ", ".join(f"{c} {d:+.4f}" for c, d in differences) + f"; {verdict}")
    return ["", "Pretrained encoder minus its random twin (the same architecture randomly initialised):", *lines] \
        if lines else []


def _seeds_ahead(row: dict, other: dict) -> tuple[int, int]:
    """On how many of the seeds both rows have a score `row` scored higher, and of how many."""
    pairs = [(a, b) for a, b in zip(row.get("per_seed") or [], other.get("per_seed") or [])
             if a is not None and b is not None]
    return sum(a > b for a, b in pairs), len(pairs)


# What the difference to each kind a pretrained kind is set beside measures (_compared's roles)
COMPARISONS = {
    "twin": "{name} is the random twin: the difference is what the start and the pretraining bought together",
    "control": "{name} is the control, the same start without what pretraining trained: the difference is what "
               "pretraining itself bought",
    "twin and control": "{name} is the control too: pretraining started from random initialisation",
}


def _compared(row: dict) -> list[tuple[str, str]]:
    """The kinds a pretrained row is set beside, each with its role (COMPARISONS): its random twin
    (FinetuneKind.random_twin) and its control in the run that wrote the row (the row's `control`, from
    pipeline.downstream.finetune.controls_in_run), which may be the twin."""
    twin = MODEL_KINDS[row["model"]].random_twin if row["model"] in MODEL_KINDS else None
    control = row.get("control")
    if control is not None and control == twin:
        return [(twin, "twin and control")]
    return [(name, role) for name, role in ((twin, "twin"), (control, "control")) if name is not None]


def pretrained_vs_random(rows: list[dict]) -> list[str]:
    """One line per pretrained model kind, task, metric and kind it is set beside (its random-init twin, and its
    control where that is another kind): the mean difference and on how many seeds the pretrained one was ahead (a
    mean can hide one collapsed seed); a line of a control says what it measures."""
    by_key = {(r["model"], r["task"], r["metric"]): r for r in rows}
    lines = []
    for (model, task, metric), row in by_key.items():
        for name, role in _compared(row):
            other = by_key.get((name, task, metric))
            if other is None or not row.get("per_seed") or not other.get("per_seed"):
                continue
            if undefined := [kind for kind, r in ((model, row), (name, other)) if r["seeds"] == 0]:
                lines.append(f"- {task} {metric}: {model} - {name} undefined: no seed of {' or '.join(undefined)} has "
                             "a defined score")
                continue
            ahead, seeds = _seeds_ahead(row, other)
            lines.append(f"- {task} {metric}: {model} - {name} = {row['score'] - other['score']:+.4f} "
                         f"(mean over seeds); {model} ahead on {ahead} of {seeds} seeds"
                         + ("" if role == "twin" else f" ({COMPARISONS[role].format(name=name)})"))
    return [""] + lines if lines else []


def pretraining_gains(rows: list[dict]) -> list[str]:
    """One line per pretrained model kind, task, metric and number of labelled examples: its mean difference to its
    random-init twin and to its control where that is another kind (each with on how many seeds it was ahead), to
    each baseline fitted on the same examples (w2v_mean: is the pretrained encoder better than word2vec on the same
    text?) and to each of FLAT_BASELINES, the same at every size (lead_n: is it above copying the source's first
    words?); where a control is in the table, what the differences to it and to the twin measure."""
    by_key = {(r["model"], r["task"], r["metric"], r["train_examples"]): r for r in rows}
    baselines = [b for b in SUBSET_BASELINES if any(r["model"] == b for r in rows)]
    flat = {(r["task"], r["metric"]): r for r in rows if r["model"] in FLAT_BASELINES}
    lines, roles = [], {}
    for (model, task, metric, examples), row in by_key.items():
        compared = [(name, role) for name, role in _compared(row) if (name, task, metric, examples) in by_key]
        if not compared:
            continue
        parts = []
        for name, role in compared:
            other = by_key[name, task, metric, examples]
            ahead, seeds = _seeds_ahead(row, other)
            parts.append(f"{model} - {name} = {row['score'] - other['score']:+.4f} (ahead on {ahead} of {seeds} seeds)")
            roles[name, role] = None
        parts += [f"{model} - {b} = {row['score'] - by_key[b, task, metric, examples]['score']:+.4f}"
                  for b in baselines if (b, task, metric, examples) in by_key]
        if (reference := flat.get((task, metric))) is not None:
            parts.append(f"{model} - {reference['model']} = {row['score'] - reference['score']:+.4f}")
        lines.append(f"- {task} {metric}, {examples} examples: " + "; ".join(parts))
    if not lines:
        return []
    # a run without controls keeps the plain heading: a difference to the twin is all it states
    told = [] if all(role == "twin" for _, role in roles) else \
        [f"{COMPARISONS[role].format(name=name)}." for name, role in roles]
    return ["", "What pretraining bought, at each number of labelled examples (mean over seeds):", *told, *lines]


def figure_metrics(rows: list[dict]) -> dict[str, str]:
    """Each task of `rows` -> the metric the figures draw for it: one of FIGURE_METRICS where it reports one (a
    generation task's ROUGE-L), else its main metric, the first it reports."""
    reported: dict[str, list[str]] = {}
    for row in rows:
        reported.setdefault(row["task"], []).append(row["metric"])
    return {task: next((m for m in FIGURE_METRICS if m in metrics), metrics[0]) for task, metrics in reported.items()}


def _label_efficiency_section(rows: list[dict], out: Path, title: str, figures: dict[str, Path]) -> list[str]:
    """The scored split's score per number of labelled examples, pretrained next to random init and the baselines
    fitted on the same examples, the FLAT_BASELINES (lead_n) beside every size: where pretraining pays most. Each
    task's table of the metric its figure draws comes first."""
    flat = [r for r in rows if r["model"] in FLAT_BASELINES]
    curves = [r for r in rows if r["model"] not in FLAT_BASELINES]
    drawn = figure_metrics(rows)
    figures["label_efficiency_plot"] = out / "label_efficiency.png"
    plot_label_efficiency(curves, figures["label_efficiency_plot"], title=f"Label efficiency ({title})",
                          dashed=tuple(SUBSET_BASELINES), flat=flat, metrics=drawn)
    sizes = list(dict.fromkeys(r["train_examples"] for r in curves))
    models = list(dict.fromkeys(r["model"] for r in curves))
    split = {"train_holdout": "held-out train", "test": "test"}.get(_scored_on(rows), "dev")
    lines = ["", f"## Label efficiency ({split} score by labelled training examples)", ""]
    reported = {task: list(dict.fromkeys(r["metric"] for r in rows if r["task"] == task)) for task in drawn}
    for task, metric in ((task, metric) for task, first in drawn.items()
                         for metric in [first, *(m for m in reported[task] if m != first)]):
        cell = {(r["model"], r["train_examples"]): _score(r) for r in curves
                if r["task"] == task and r["metric"] == metric}
        seeds = max(r["seeds"] for r in rows if r["task"] == task)
        lines += [f"{task} {metric}, {seeds} seeds:", "", "| model | " + " | ".join(map(str, sizes)) + " |",
                  "|---" * (len(sizes) + 1) + "|"]
        lines += [f"| {m} | " + " | ".join(cell.get((m, n), "–") for n in sizes) + " |" for m in models]
        # one score, repeated under every size so that each column reads against it
        lines += [f"| {r['model']} (trains nothing: the same at every size; fitted on all {r['train_examples']} train "
                  f"examples) | " + " | ".join([_score(r)] * len(sizes)) + " |"
                  for r in flat if (r["task"], r["metric"]) == (task, metric)] + [""]
    return lines + pretraining_gains(rows) + ["", "![label efficiency](label_efficiency.png)"]


def _pretrain_scaling_section(rows: list[dict], results: list[dict], out: Path, title: str,
                              figures: dict[str, Path]) -> list[str]:
    """Dev score per pretraining step of the encoder (its snapshots, then the final one), next to the models without
    pretraining steps (random initialisation) and the baselines: what more pretraining buys downstream."""
    curves = [{**r, "model": r["model"].partition(SNAPSHOT_MARK)[0]} for r in rows]
    others = [r for r in results if r.get("pretraining_steps") is None and not is_snapshot(r)]
    figures["pretrain_scaling_plot"] = out / "pretrain_scaling.png"
    plot_pretrain_scaling(curves, [r for r in others if r["model"] not in BASELINES],
                          [r for r in others if r["model"] in BASELINES], figures["pretrain_scaling_plot"],
                          title=f"Downstream score by pretraining steps ({title})", metrics=figure_metrics(curves))
    steps = list(dict.fromkeys(r["pretraining_steps"] for r in curves))
    lines = ["", "## Downstream score by pretraining steps (dev score of the encoder at each step)", ""]
    for task, metric in dict.fromkeys((r["task"], r["metric"]) for r in curves):
        mine = [r for r in curves if r["task"] == task and r["metric"] == metric]
        cell = {(r["model"], r["train_examples"], r["pretraining_steps"]): _score(r) for r in mine}
        lines += [f"{task} {metric}, {max(r['seeds'] for r in mine)} seeds; columns: pretraining steps", "",
                  "| model | train examples | " + " | ".join(map(str, steps)) + " |", "|---" * (len(steps) + 2) + "|"]
        lines += [f"| {model} | {n} | " + " | ".join(cell.get((model, n, s), "–") for s in steps) + " |"
                  for model, n in dict.fromkeys((r["model"], r["train_examples"]) for r in mine)]
        lines += ["", *(f"- {r['model']}, {r['train_examples']} train examples: {_score(r)}" for r in others
                        if r["task"] == task and r["metric"] == metric), ""]
    return lines + ["![downstream score by pretraining steps](pretrain_scaling.png)"]


def _pretraining_section(stage: str, stage_dir: Path, out: Path, figures: dict[str, Path]) -> list[str]:
    curves = read_curves(stage_dir / "loss_curve.csv")
    train, val = curves.get("train/loss", []), curves.get("val/loss", [])
    perplexity = next((curves[name] for name in PERPLEXITY_NAMES if name in curves), [])
    info = json.loads((stage_dir / "stage.json").read_text())
    lines = ["", f"## Pretraining ({stage})", "", *summarise_loss(train, val), *learning_lines(info)]
    if perplexity:
        lines.append("- held-out perplexity: " + ", ".join(f"{v:.1f} @ {s}" for s, v in perplexity))
    lines.append(f"- {info.get('steps')} steps in {info.get('duration_s')} s, precision {info.get('precision')}, "
                 f"{info.get('num_parameters')} parameters")
    if train:
        path = out / f"{stage}_loss.png"
        nsp_trained = "val/nsp_acc" in curves and info.get("final_val_nsp_acc") is not None
        plot_pretraining(train, val, perplexity, path, title=f"Pretraining ({stage})",
                         val_mlm_loss=curves.get("val/mlm_loss", []), unigram_loss=info.get("unigram_mlm_loss"),
                         # no NSP curve for a run without the NSP loss: its head was never trained
                         accuracies={"masked LM": curves.get("val/mlm_acc", []),
                                     "next sentence": curves.get("val/nsp_acc", []) if nsp_trained else []},
                         majority_rate=info.get("nsp_majority_rate") if nsp_trained else None)
        figures[f"{stage}_loss_plot"] = path
        lines += ["", f"![{stage} loss and perplexity]({path.name})"]
    return lines


def pretraining_budget(summaries: dict[str, dict[str, dict]]) -> list[str]:
    """The pretraining stages of a run that pretrains more than one family (family -> stage -> its stage.json), side by
    side by the time their training took (`seconds`, the harness's clock around the training loop, validation
    included): the budget a run that compares families holds equal (experiment=bert_vs_gpt). A stage resumed after a
    kill counts only the steps since the resume; its full time is estimated at its seconds per step."""
    lines = ["", "## Pretraining budget", "", "| family | stage | steps | training s | s/step | parameters |",
             "|---|---|---|---|---|---|"]
    totals = {}
    for family, stages in summaries.items():
        for stage, info in stages.items():
            resumed = info.get("resumed_from_step") or 0
            per_step = info["seconds"] / max(1, info["steps"] - resumed)
            since = f" (since the resume at step {resumed})" if resumed else ""
            lines.append(f"| {family} | {stage} | {info['steps']} | {info['seconds']:.0f}{since} | {per_step:.3f} | "
                         f"{info['num_parameters']:,} |")
            totals[family] = totals.get(family, 0.0) + per_step * info["steps"]
    longest, shortest = max(totals, key=totals.get), min(totals, key=totals.get)
    return lines + ["", f"- {longest}'s pretraining took {totals[longest] / totals[shortest]:.2f}x the time of "
                        f"{shortest}'s ({', '.join(f'{f} {t:.0f} s' for f, t in totals.items())})"]


def models_section(ran: dict[str, list[str]], stage_dirs: dict[str, Path]) -> list[str]:
    """The architecture each pretraining stage trained, where its summary names one (`model`: the seq2seq family's,
    whose rows are named by kind whichever encoder-decoder the run's `model` built), ahead of the results."""
    described = [(family, stage, info["model"]) for family, stages in ran.items() for stage in stages
                 if "model" in (info := json.loads((stage_dirs[stage] / "stage.json").read_text()))]
    if not described:
        return []
    return ["", "## Models", "", *(f"- {family} ({stage}): {model}" for family, stage, model in described)]


def learning_lines(summary: dict) -> list[str]:
    """Markdown lines: the final held-out MLM loss against the unigram baseline, the accuracies, and the plateau
    warning of a run that has not learned more than token frequencies (pipeline/bert/diagnostics.py)."""
    mlm, unigram = summary.get("final_val_mlm_loss"), summary.get("unigram_mlm_loss")
    if mlm is None or unigram is None:
        return []
    lines = [f"- held-out masked-LM loss {mlm:.3f} against the unigram baseline {unigram:.3f} "
             f"({unigram - mlm:+.2f} nats learned from context); masked-LM accuracy "
             f"{summary.get('final_val_mlm_acc', float('nan')):.3f}"]
    if summary.get("final_val_nsp_acc") is not None:
        lines[-1] += (f"; next-sentence accuracy {summary['final_val_nsp_acc']:.3f} (majority rate "
                      f"{summary.get('nsp_majority_rate', float('nan')):.3f})")
    if summary.get("plateau_warning"):
        lines.append(f"- **Warning: {summary['plateau_warning']}.**")
    return lines


def corpus_lines(manifest: dict, name: str = "The pretraining text") -> list[str]:
    """What prepare kept of the corpus (its manifest), and what it removed as overlapping the run's evaluation text, or
    that it did not look (data.decontaminate=false): whether a score can have been read in pretraining."""
    t = manifest["totals"]
    lines = [f"{name}: {t['files_kept']:,} of its {t['files_read']:,} documents kept ({t['files_duplicate']:,} exact "
             f"and {t['files_near_duplicate']:,} near duplicates dropped, {t['files_rejected']:,} rejected), "
             f"{t['sentences']:,} sentences, {human_bytes(t['input_bytes'])} of text read.", ""]
    decontamination = manifest.get("decontamination")
    if decontamination is None:
        return lines + ["Not decontaminated (data.decontaminate=false): the evaluation text may overlap it.", ""]
    removed = decontamination["sentences_removed_by_source"]
    by_source = "; ".join(f"{source}: {n:,}" for source, n in removed.items()) if len(removed) > 1 else ""
    sources = ", ".join(decontamination["sources"]) or "none"
    return lines + [f"Decontaminated against the run's evaluation text ({sources}): "
                    f"{decontamination['sentences_removed']:,} sentences removed, the same sentence normalised or a "
                    f"shared {decontamination['ngram']}-gram" + (f" ({by_source})" if by_source else "") + ".", ""]


def _log_to_wandb(run, rows: list[dict], figures: dict[str, Path]) -> None:
    import wandb

    table = wandb.Table(columns=["stage", *RESULT_COLUMNS], data=[[r.get(c) for c in ["stage", *RESULT_COLUMNS]]
                                                                  for r in rows])
    run.log({"report/results": table, **{f"report/{name}": wandb.Image(str(path)) for name, path in figures.items()}})


def write_report(stage_dirs: dict[str, Path], out: Path, title: str,
                 pretraining_stages: dict[str, tuple[str, ...]] | None = None,
                 sections: tuple[Callable[[dict[str, Path], Path, dict[str, Path]], list[str]], ...] = (),
                 wandb_run=None) -> dict[str, Path]:
    """Everything the report stage writes into `out`, from the output directories of the stages it read: finetune /
    evaluate results, the curves of `pretraining_stages` (family -> its stages), then each of `sections` (stage dirs,
    out, figures) -> markdown lines, which records the figures it draws. Returns name -> path of every file written.
    `wandb_run`: the stage's W&B run, or None."""
    lines, rows, figures = [f"# Results: {title}"], [], {}
    panels = {}
    ran = {family: in_run for family, stages in (pretraining_stages or {}).items()
           if (in_run := [stage for stage in stages if stage in stage_dirs])}
    lines += models_section(ran, stage_dirs)
    for stage in RESULT_STAGES:
        if stage in stage_dirs:
            results = json.loads((stage_dirs[stage] / "results.json").read_text())
            rows += [{"stage": stage, **r} for r in results]
            skipped = probes_without_data(stage_dirs[stage]) if stage == "evaluate" else {}
            lines += _results_section(stage, results, skipped)
            if headline := headline_results(results):  # a panel of no bars divided by zero
                panels[RESULT_STAGES[stage]] = headline
            if stage == "finetune" and (curve := label_efficiency(results)):
                lines += _label_efficiency_section(curve, out, title, figures)
            if stage == "finetune" and (scaling := pretraining_scaling(results)):
                lines += _pretrain_scaling_section(scaling, results, out, title, figures)
            if stage == "finetune":
                lines += writing_section(headline) + generated_section(stage_dirs[stage])
    if panels:
        figures["task_scores_plot"] = out / "task_scores.png"
        plot_task_scores(panels, figures["task_scores_plot"], title=f"Task scores per model ({title})",
                         metrics=figure_metrics([r for rows in panels.values() for r in rows]))
        lines += ["", "![task scores per model](task_scores.png)"]
    if len(ran) > 1:
        lines += pretraining_budget({family: {stage: json.loads((stage_dirs[stage] / "stage.json").read_text())
                                              for stage in stages} for family, stages in ran.items()})
    if "prepare" in stage_dirs:
        lines += ["", "## Pretraining text", "", *corpus_lines(json.loads((stage_dirs["prepare"] / MANIFEST_NAME)
                                                                           .read_text()))]
    for stage in (stage for stages in ran.values() for stage in stages):
        lines += _pretraining_section(stage, stage_dirs[stage], out, figures)
    for section in sections:
        lines += section(stage_dirs, out, figures)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["stage", *RESULT_COLUMNS], extrasaction="ignore")
        writer.writeheader()
        # train_size: the finetune.train_sizes entry of the row ("all": the whole train split), which tells the rows
        # of the label-efficiency curve apart
        writer.writerows({**r, "train_size": "all" if r.get("train_size") is None else r["train_size"]}
                         if r["stage"] == "finetune" else r for r in rows)
    # All fields (train/dev sizes, seconds), unlike the CSV's fixed columns: for scripts that compare runs.
    write_json_atomically(out / "results.json", rows)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    if wandb_run is not None:
        _log_to_wandb(wandb_run, rows, figures)
    return {"results_md": out / "results.md", "results_csv": out / "results.csv",
            "results_json": out / "results.json", **figures}
