"""A stage's W&B run in a process that is ended afterwards, as Ray ends idle workers: no traceback at exit."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STAGE_RUN_THEN_WORKER_ENDS = textwrap.dedent("""
    import sys
    from pathlib import Path

    import psutil
    from omegaconf import OmegaConf

    from pipeline.engine.tracking import finish_stage_run, start_stage_run

    cfg = OmegaConf.create({"experiment_name": "unit", "logger": {
        "_target_": "lightning.pytorch.loggers.WandbLogger", "project": "p", "mode": "offline"}})
    run_dir = Path(sys.argv[1])
    run = start_stage_run(cfg, "prepare", "abc123", run_dir, {})
    finish_stage_run(run, "prepare", "abc123", run_dir, ok=True, summary={"sentences": 3})
    children = psutil.Process().children(recursive=True)
    for child in children:  # Ray ends a worker's child processes with it
        child.kill()
    psutil.wait_procs(children, timeout=30)
    # a data stage's worker runs this too, and must not load torch for it (tests/run/test_layering.py)
    assert not {"torch", "lightning"} & set(sys.modules), sorted({"torch", "lightning"} & set(sys.modules))
""")


def test_a_finished_stage_run_leaves_no_service_to_tear_down_at_exit(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_SERVICE", None)
    done = subprocess.run([sys.executable, "-c", STAGE_RUN_THEN_WORKER_ENDS, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the stage's offline run was not written"


def test_the_listed_wandb_logger_parameters_are_lightnings():
    import inspect

    from lightning.pytorch.loggers import WandbLogger

    from pipeline.engine.tracking import WANDB_LOGGER_PARAMETERS

    assert WANDB_LOGGER_PARAMETERS == set(inspect.signature(WandbLogger).parameters)


class RecordingRun:
    """What the engine asks of a wandb Run, recorded."""

    def __init__(self, **init_kwargs):
        self.init_kwargs, self.logged, self.artifacts, self.summary = init_kwargs, [], [], {}
        self.id = "run1"

    def log(self, values, step=None):
        self.logged.append((step, values))

    def log_artifact(self, artifact, aliases=None):
        self.artifacts.append((artifact.name, artifact.type, aliases))

    def finish(self, exit_code=0):
        pass


def test_stage_outputs_are_versions_of_one_artifact_per_stage_aliased_by_hash_and_runs_carry_tags(
        tmp_path, monkeypatch):
    import wandb
    from omegaconf import OmegaConf

    from pipeline.engine.tracking import LINEAGE_FILE, finish_stage_run, start_stage_run

    monkeypatch.setattr(wandb, "init", lambda **kwargs: RecordingRun(**kwargs))
    monkeypatch.setattr(wandb, "teardown", lambda: None)
    cfg = OmegaConf.create({"experiment_name": "unit", "model": {"config": {"name": "bert_tiny"}},
                            "logger": {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "p",
                                       "mode": "offline"}})
    run = start_stage_run(cfg, "bert_pretrain", "abc123", tmp_path, {"bert_examples": (tmp_path, "def456")})
    finish_stage_run(run, "bert_pretrain", "abc123", tmp_path, ok=True, summary={"steps": 3})
    assert run.init_kwargs["tags"] == ["unit", "bert_pretrain", "bert_tiny"]
    assert run.artifacts == [("bert_pretrain", "bert_pretrain", ["abc123"])]
    assert '"uses": ["bert_examples:def456"]' in (tmp_path / LINEAGE_FILE).read_text()


def test_a_distributed_runs_curves_reach_the_stage_run_step_by_step(tmp_path):
    from pipeline.engine.tracking import log_curves

    curve = tmp_path / "loss_curve.csv"
    curve.write_text("step,split,name,value\n2,train,train/loss,5.0\n1,train,train/loss,6.0\n"
                     "2,val,val/loss,5.5\n2,val,val/mlm_acc,0.1\n")
    run = RecordingRun()
    assert log_curves(run, curve) == 2
    assert run.logged == [(1, {"train/loss": 6.0}), (2, {"train/loss": 5.0, "val/loss": 5.5, "val/mlm_acc": 0.1})]
    assert log_curves(None, curve) == 0 and log_curves(run, tmp_path / "missing.csv") == 0


def test_pretraining_in_ray_train_workers_logs_rank_0s_curves_to_the_stage_run(tmp_path, monkeypatch):
    """Issue 18: DDP/DeepSpeed runs logged to CSV only, so W&B showed no curves for exactly the distributed runs."""
    import json

    from pipeline.bert.pretrain import PRETRAINING
    from pipeline.engine import pretraining
    from pipeline.engine.dag import StageContext
    from pipeline.engine.pretraining_outputs import LOSS_CURVE, WORKER_SUMMARY
    from tests.helpers import tiny_config

    def fake_workers(worker, config, settings, out_dir):
        (out_dir / LOSS_CURVE).write_text("step,split,name,value\n1,train,train/loss,7.0\n")
        (out_dir / WORKER_SUMMARY).write_text(json.dumps({"steps": 1}))

    monkeypatch.setattr(pretraining, "run_on_ray_workers", fake_workers)
    ctx = StageContext(tiny_config(tmp_path, ["trainer=ddp_cpu"]), "bert_pretrain", tmp_path, {})
    ctx.out_dir.mkdir(exist_ok=True)
    ctx.wandb_run = RecordingRun()
    assert pretraining.pretrain(ctx, PRETRAINING["bert_pretrain"]) == {"steps": 1}
    assert ctx.wandb_run.logged == [(1, {"train/loss": 7.0})]
