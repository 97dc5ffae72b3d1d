"""`ray.address=HOST:PORT` runs the stages on an existing Ray cluster (here a head started on loopback) instead of
starting a private Ray instance."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.pipeline_cli import pipeline_env, run_pipeline_cli, stage_executions

RAY_CLI = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_using(temp_dir: Path) -> list[psutil.Process]:
    """The cluster's processes: every one of them names its session directory, under temp_dir, on its command line
    (workers by their log files); nothing else on the machine does."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(temp_dir) in arg for arg in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def _start_head(port: int, temp_dir: Path, env: dict) -> subprocess.Popen:
    # --block keeps `ray start` in the foreground as the parent of the cluster's processes, in a session of its own,
    # so the test stops exactly this cluster. `ray stop` is never used: it stops every Ray process on the machine,
    # including other users' instances. The own --temp-dir keeps the head out of /tmp/ray/ray_current_cluster,
    # where any local `ray.init()` would find (and join) it.
    log_path = temp_dir / "ray-start.log"  # a file, not a pipe: nobody reads on while the test runs
    with open(log_path, "w") as log:
        head = subprocess.Popen(
            [str(RAY_CLI), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
             "--include-dashboard=false", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
             "--disable-usage-stats"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and head.poll() is None:
        if "Ray runtime started" in log_path.read_text():
            return head
        time.sleep(0.5)
    _stop_head(head, temp_dir)
    raise AssertionError("ray start --head did not come up:\n" + log_path.read_text()[-4000:])


def _stop_head(head: subprocess.Popen, temp_dir: Path) -> None:
    os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops the processes it started
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    _, alive = psutil.wait_procs(_processes_using(temp_dir), timeout=30)
    for proc in alive:  # a straggler outside the process group: still ours, named by our temp dir
        proc.kill()
    psutil.wait_procs(alive, timeout=30)


@pytest.mark.slow
def test_the_pipeline_joins_a_running_cluster(tmp_path):
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's unix sockets live under it
    port = _free_port()
    env = pipeline_env(tmp_path, RAY_ADDRESS="")
    head = _start_head(port, temp_dir, env)
    try:
        result = run_pipeline_cli(tmp_path, ["pipeline.until=examples", f"ray.address=127.0.0.1:{port}"],
                                  RAY_ADDRESS="")
        driver_log = result.stdout + result.stderr
        # Ray reports the head by the node's address, which need not be the loopback one we gave.
        connected = re.search(rf"Connecting to existing Ray cluster at address: \S+:{port}\b", driver_log)
        assert connected, driver_log[-3000:]
        assert "Connected to Ray cluster." in driver_log and "Started a local Ray instance" not in driver_log
        for stage in ("prepare", "tokenizer", "examples"):
            assert (tmp_path / "run" / stage / "_COMPLETE.json").is_file(), stage
            assert stage_executions(tmp_path / "cache", stage) == 1, stage
        assert not (tmp_path / "run" / "pretrain").exists()
        # The stages ran in the cluster's workers: their output is in that cluster's worker logs.
        worker_logs = "".join(p.read_text(errors="replace")
                              for p in (temp_dir / "session_latest" / "logs").glob("worker-*.out"))
        assert "stage prepare: running" in worker_logs and "stage examples: running" in worker_logs
    finally:
        _stop_head(head, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert _processes_using(temp_dir) == []
