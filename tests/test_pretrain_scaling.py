"""More pretraining, better downstream: encoder snapshots written during pretraining (pretrain.encoder_snapshots).
Exact resume of the snapshots after a kill: tests/test_resume.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.bert.pretrain import HEADS_FILE
from pipeline.engine.dag import StageFailed
from pipeline.engine.pretraining import encoder_snapshots
from pipeline.runner import validate
from tests.helpers import TinyRun, file_bytes, tiny_config

SNAPSHOTS = "pretrain.encoder_snapshots=[10,30]"  # the tiny run's last step is 30


@pytest.fixture(scope="module")
def root(tmp_path_factory, ray_session) -> Path:
    return tmp_path_factory.mktemp("scaling")


@pytest.fixture(scope="module")
def run(root) -> TinyRun:
    tiny = TinyRun(tiny_config(root, [SNAPSHOTS]))
    for stage in ("prepare", "tokenizer", "examples", "pretrain"):
        tiny.run_stage(stage)
    return tiny


def test_snapshots_are_written_at_the_requested_steps_and_the_last_is_the_final_encoder(run, root):
    out = run.stage_dir("pretrain")
    snapshots = encoder_snapshots(out)
    assert list(snapshots) == [10, 30]
    assert sorted(p.name for p in (out / "encoder_snapshots").iterdir()) == ["step-10", "step-30"]  # none half-written
    final = {name: data for name, data in file_bytes(out).items() if name.startswith("encoder/") or name == HEADS_FILE}
    assert file_bytes(snapshots[30]) == final  # what the stage writes at the end, as the stage wrote it
    assert file_bytes(snapshots[10])["encoder/model.safetensors"] != final["encoder/model.safetensors"]
    plain = TinyRun(tiny_config(root))  # the same data stages, cached; pretraining without snapshots
    plain.run_stage("pretrain")
    assert file_bytes(plain.stage_dir("pretrain") / "encoder") == file_bytes(out / "encoder")  # they change nothing


@pytest.mark.parametrize("overrides, message", [
    (["pretrain.encoder_snapshots=[0,10]"], "pretrain.encoder_snapshots=[0, 10]: [0] not a step of the run"),
    (["pretrain.encoder_snapshots=[31]"], "each must be a whole number from 1 to pretrain.max_steps=30"),
    (["pipeline.stages=[pretrain_phase2]", "pretrain_phase2.encoder_snapshots=[101]"],
     "pretrain_phase2.encoder_snapshots=[101]"),  # phase 2 counts its own 100 steps
    (["trainer=deepspeed_stage_2", "trainer.accelerator=cpu", "pretrain.encoder_snapshots=[10]"],
     "pretrain with trainer=cpu or trainer=ddp_cpu to keep snapshots"),
])
def test_snapshot_steps_the_run_cannot_write_are_refused_at_start_up(root, overrides, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(tiny_config(root, overrides))


def test_the_pretraining_stage_itself_refuses_a_snapshot_after_its_last_step(run, root):
    beyond = TinyRun(tiny_config(root, ["pretrain.encoder_snapshots=[31]"]))
    with pytest.raises(StageFailed, match=r"pretrain.encoder_snapshots=\[31\]"):
        beyond.run_stage("pretrain")
    assert not (beyond.stage_dir("pretrain") / "checkpoints").exists()
