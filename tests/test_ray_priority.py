"""The pipeline's local Ray runs its stage tasks at the driver's own priority, not at Ray's default nice 15."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import os, ray
from omegaconf import OmegaConf
from pipeline.runner import init_ray
init_ray(OmegaConf.create({"ray": {"address": None, "num_cpus": 1}}))
print(os.nice(0), ray.get(ray.remote(lambda: os.nice(0)).remote()))
ray.shutdown()
"""


def test_stage_tasks_run_at_the_driver_priority():
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    driver, worker = map(int, out.stdout.split()[-2:])
    assert worker == driver
