"""A stage's W&B run in a process that is ended afterwards, as Ray ends idle workers: no traceback at exit."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

STAGE_RUN_THEN_WORKER_ENDS = textwrap.dedent("""
    import sys
    from pathlib import Path

    import psutil
    from omegaconf import OmegaConf

    from pipeline.engine.tracking import finish_stage_run, start_stage_run

    cfg = OmegaConf.create({"experiment_name": "unit", "logger": {"kind": "wandb", "project": "p", "mode": "offline"}})
    run_dir = Path(sys.argv[1])
    run = start_stage_run(cfg, "prepare", "abc123", run_dir, {})
    finish_stage_run(run, "prepare", "abc123", run_dir, ok=True, summary={"sentences": 3})
    children = psutil.Process().children(recursive=True)
    for child in children:  # Ray ends a worker's child processes with it
        child.kill()
    psutil.wait_procs(children, timeout=30)
""")


def test_a_finished_stage_run_leaves_no_service_to_tear_down_at_exit(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_SERVICE", None)
    done = subprocess.run([sys.executable, "-c", STAGE_RUN_THEN_WORKER_ENDS, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the stage's offline run was not written"
