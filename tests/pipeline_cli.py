"""`python -m pipeline` run as a user runs it, in a subprocess, on the tiny config and data the test writes.

Shared by the tests that need a real process: sweeps (Hydra multirun), crash safety (SIGKILL), interrupts (SIGINT,
SIGTERM) and Ray clusters."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psutil

from tests.helpers import TINY_OVERRIDES, write_books, write_sentiment_task

REPO_ROOT = Path(__file__).resolve().parent.parent


def tiny_overrides(tmp_path: Path, overrides: list[str]) -> list[str]:
    """bert_tiny shrunk to seconds on test-written data, with `overrides` replacing the defaults of the same key."""
    corpus, task = tmp_path / "books", tmp_path / "task"
    if not corpus.exists():  # written once: rewriting changes the corpus fingerprint, i.e. the data
        write_books(corpus)
        write_sentiment_task(task)
    defaults = ["+experiment=bert_tiny", f"data.corpus_dir={corpus}", f"finetune.data_dir={task}",
                f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}",
                f"hydra.sweep.dir={tmp_path / 'multirun'}", *TINY_OVERRIDES]
    replaced = {o.split("=", 1)[0] for o in overrides}
    return [o for o in defaults if o.split("=", 1)[0] not in replaced] + overrides


def pipeline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # No W&B key, login or cached credentials (HOME): runs stay offline and never wait for a network.
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": "", "RAY_AUTH_MODE": "disabled",
            "HOME": str(tmp_path / "home"), **extra}


def pipeline_command(tmp_path: Path, overrides: list[str], multirun: bool = False) -> list[str]:
    return [sys.executable, "-m", "pipeline", *(["-m"] if multirun else []), *tiny_overrides(tmp_path, overrides)]


def run_pipeline_cli(tmp_path: Path, overrides: list[str], multirun: bool = False, timeout: float = 600,
                     **env: str) -> subprocess.CompletedProcess:
    """Runs the pipeline to completion and fails the test, with the output's tail, if it did not succeed."""
    result = subprocess.run(pipeline_command(tmp_path, overrides, multirun), capture_output=True, text=True,
                            cwd=REPO_ROOT, env=pipeline_env(tmp_path, **env), timeout=timeout,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def stage_executions(cache_dir: Path, stage: str) -> int:
    """How often `stage` was executed, in any process: every execution appends its start line to the stage.log
    of its output directory (pipeline/engine/dag.py)."""
    return sum(log.read_text().count(f"stage {stage}: running")
               for log in (cache_dir / "stages" / stage).glob("*/stage.log"))


def start_pipeline_cli(tmp_path: Path, overrides: list[str]) -> subprocess.Popen:
    # A session of its own: the driver, the Ray instance it started and that instance's workers share one
    # process group, so a single killpg is what a crash of the machine's user session (SIGKILL) or Ctrl-C in a
    # terminal (SIGINT) looks like.
    return subprocess.Popen(pipeline_command(tmp_path, overrides), cwd=REPO_ROOT, env=pipeline_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for_file(proc: subprocess.Popen, cache_dir: Path, pattern: str, timeout: float = 600) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(cache_dir.glob(pattern))
        if found:
            return found[0]
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {pattern} appeared:\n"
                                 + proc.stdout.read()[-4000:])
        time.sleep(0.02)
    raise AssertionError(f"no {pattern} under {cache_dir} after {timeout} s")


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


@contextlib.contextmanager
def ray_cluster(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A Ray cluster of one 2-CPU head on loopback: yields its port and temp dir, and stops every process of it."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's unix sockets live under it
    port = _free_port()
    head = _start_head(port, temp_dir, pipeline_env(tmp_path, RAY_ADDRESS=""))
    try:
        yield port, temp_dir
    finally:
        _stop_head(head, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert _processes_using(temp_dir) == []
