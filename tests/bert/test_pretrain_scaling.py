"""More pretraining, better downstream: encoder snapshots written during pretraining (pretrain.encoder_snapshots), each
fine-tuned next to the final encoder, and the report's plot of downstream score against pretraining steps. Exact
resume of the snapshots after a kill: tests/engine/test_resume.py."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.colors as mcolors
import pytest

from pipeline.bert.pretrain import HEADS_FILE
from pipeline.downstream.finetune import finetune_settings, model_sources
from pipeline.engine.dag import StageContext, StageFailed
from pipeline.engine.snapshots import encoder_snapshots, snapshot_dir
from pipeline.report.plots import plot_pretrain_scaling
from pipeline.runner import validate
from tests.helpers import TinyRun, file_bytes, tiny_config

SNAPSHOTS = "pretrain.encoder_snapshots=[10,30]"  # the tiny run's last step is 30


@pytest.fixture(scope="module")
def root(tmp_path_factory, ray_session) -> Path:
    return tmp_path_factory.mktemp("scaling")


@pytest.fixture(scope="module")
def run(root) -> TinyRun:
    tiny = TinyRun(tiny_config(root, [SNAPSHOTS]))
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_pretrain", "word2vec"):
        tiny.run_stage(stage)
    return tiny


def test_snapshots_are_written_at_the_requested_steps_and_the_last_is_the_final_encoder(run, root):
    out = run.stage_dir("bert_pretrain")
    snapshots = encoder_snapshots(out)
    assert list(snapshots) == [10, 30]
    assert sorted(p.name for p in (out / "encoder_snapshots").iterdir()) == ["step-10", "step-30"]  # none half-written
    final = {name: data for name, data in file_bytes(out).items()
             if name.startswith(("encoder/", "hf/")) or name == HEADS_FILE}
    assert file_bytes(snapshots[30]) == final  # what the stage writes at the end, as the stage wrote it
    assert file_bytes(snapshots[10])["encoder/model.safetensors"] != final["encoder/model.safetensors"]
    plain = TinyRun(tiny_config(root))  # the same data stages, cached; pretraining without snapshots
    plain.run_stage("bert_pretrain")
    # they change nothing
    assert file_bytes(plain.stage_dir("bert_pretrain") / "encoder") == file_bytes(out / "encoder")


def test_every_snapshot_is_fine_tuned_with_its_pretraining_steps_and_reported(run):
    pretrain = run.stage_dir("bert_pretrain")
    ctx = StageContext(run.cfg, "finetune", run.stage_dir("finetune"),
                       {u: run.stage_dir(u) for u in run.plan.stages["finetune"].upstream})
    sources = model_sources(ctx, finetune_settings(ctx.cfg))
    assert {name: steps for name, (_, steps) in sources.items()} == {"bert": 30, "bert@10": 10,
                                                                    "bert_random": None}
    assert sources["bert@10"][0].encoder_dir == snapshot_dir(pretrain, 10) / "encoder"
    assert sources["bert"][0].encoder_dir == pretrain / "encoder"

    headline = run.run_stage("finetune")["results"]
    assert "bert@10" not in {r["model"] for r in headline}  # the scaling section's, not the results table's
    rows = json.loads((run.stage_dir("finetune") / "results.json").read_text())
    assert {r["model"]: r["pretraining_steps"] for r in rows} == {
        "bert": 30, "bert@10": 10, "bert_random": None, "majority_class": None, "bow_logreg": None,
        "w2v_mean": None}

    run.run_stage("report")
    out = run.stage_dir("report")
    assert (out / "pretrain_scaling.png").stat().st_size > 1000
    md = (out / "results.md").read_text()
    section = md[md.index("## Downstream score by pretraining steps"):]
    assert "| model | train examples | 10 | 30 |" in section
    assert "| bert | 160 | " in section and "- bert_random, 160 train examples: " in section
    assert "- majority_class, 160 train examples: " in section
    assert "bert@10" not in md[:md.index("## Downstream score by pretraining steps")]


@pytest.mark.parametrize("overrides, message", [
    (["pretrain.encoder_snapshots=[0,10]"], "pretrain.encoder_snapshots=[0, 10]: [0] not a step of the run"),
    (["pretrain.encoder_snapshots=[31]"], "each must be a whole number from 1 to pretrain.max_steps=30"),
    (["pipeline.stages=[bert_pretrain_phase2]", "pretrain_phase2.encoder_snapshots=[101]"],
     "pretrain_phase2.encoder_snapshots=[101]"),  # phase 2 counts its own 100 steps
    (["trainer=deepspeed", "trainer.accelerator=cpu", "pretrain.encoder_snapshots=[10]"],
     "pretrain with trainer=cpu or trainer=ddp_cpu to keep snapshots"),
])
def test_snapshot_steps_the_run_cannot_write_are_refused_at_start_up(root, overrides, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(tiny_config(root, overrides))


def test_the_pretraining_stage_itself_refuses_a_snapshot_after_its_last_step(run, root):
    beyond = TinyRun(tiny_config(root, ["pretrain.encoder_snapshots=[31]"]))
    with pytest.raises(StageFailed, match=r"pretrain.encoder_snapshots=\[31\]"):
        beyond.run_stage("bert_pretrain")
    assert not (beyond.stage_dir("bert_pretrain") / "checkpoints").exists()


def test_scaling_plot_draws_a_line_per_train_size_and_the_references_across(tmp_path):
    def row(model, examples, score, steps=None):
        return {"model": model, "task": "sst2", "metric": "accuracy", "score": score, "std": 0.01, "seeds": 3,
                "train_examples": examples, "pretraining_steps": steps}

    curves = [row("bert", n, 0.5 + steps / 10_000, steps) for n in (1000, 8530) for steps in (100, 300, 600)]
    fig = plot_pretrain_scaling(curves, [row("bert_random", 1000, 0.55), row("bert_random", 8530, 0.6)],
                                [row("majority_class", 8530, 0.5)], tmp_path / "scaling.png", "unit")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    curve = {bars.get_label(): bars.lines[0] for bars in ax.containers}  # the error bars' data lines
    assert list(curve) == ["bert, 1000 examples", "bert, 8530 examples"]
    assert list(curve["bert, 1000 examples"].get_xdata()) == [100, 300, 600]
    assert list(curve["bert, 8530 examples"].get_ydata()) == pytest.approx([0.51, 0.53, 0.56])
    lines = {line.get_label(): line for line in ax.get_lines()}
    reference = lines["bert_random, 1000 examples: 0.550"]
    assert list(reference.get_ydata()) == [0.55, 0.55]  # horizontal
    assert mcolors.same_color(reference.get_color(), curve["bert, 1000 examples"].get_color())
    assert list(lines["majority_class: 0.500"].get_ydata()) == [0.5, 0.5]
    assert (tmp_path / "scaling.png").stat().st_size > 1000
