"""Ctrl-C (SIGINT to the run's process group, as a terminal sends it) or SIGTERM (to the driver, as `kill` or a job
scheduler sends it), during Ray's start-up or while a stage runs: one line saying how to resume instead of a
KeyboardInterrupt traceback (and exit code 1 during start-up), exit code 130, and no Ray process of the run left behind
(issue 21, item 8)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from pipeline.runner import INTERRUPTED
from tests.pipeline_cli import start_pipeline_cli, wait_for_file


def _ray_starting(proc: subprocess.Popen, tmp_path: Path) -> None:
    """Returns once the driver has started the raylet, i.e. inside ray.init."""
    deadline = time.monotonic() + 300
    while not any(p.name() == "raylet" for p in psutil.Process(proc.pid).children(recursive=True)):
        assert proc.poll() is None and time.monotonic() < deadline, "no raylet started"
        time.sleep(0.02)


def _stage_running(proc: subprocess.Popen, tmp_path: Path) -> None:
    wait_for_file(proc, tmp_path / "cache", "stages/*/*/stage.log")


def _ctrl_c(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)


def _sigterm(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.parametrize("wait, send", [
    pytest.param(_ray_starting, _ctrl_c, id="ctrl-c-during-ray-start-up"),
    pytest.param(_stage_running, _ctrl_c, id="ctrl-c-in-a-stage"),
    pytest.param(_stage_running, _sigterm, id="sigterm-in-a-stage"),
])
def test_an_interrupted_run_says_how_to_resume_and_leaves_no_ray_process(tmp_path, wait, send):
    proc = start_pipeline_cli(tmp_path, ["logger=csv"])
    wait(proc, tmp_path)
    family = psutil.Process(proc.pid).children(recursive=True)
    send(proc)
    output, _ = proc.communicate(timeout=120)
    _, alive = psutil.wait_procs(family, timeout=10)
    survivors = [f"{p.pid} {' '.join(p.cmdline()[:2])}" for p in alive]
    for p in alive:
        p.kill()
    assert proc.returncode == 130, output[-4000:]
    assert output.count(INTERRUPTED) == 1 and "Traceback" not in output, output[-4000:]
    assert not survivors, f"processes of the interrupted run still alive 10 s after it ended: {survivors}"
