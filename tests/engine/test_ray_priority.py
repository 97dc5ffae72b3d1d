"""How a run starts or joins Ray: its local Ray runs the stage tasks at the driver's own priority, not at Ray's default
nice 15; a Ray the process already holds is kept, and an address the run then does not join is named."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import os, ray
from pipeline.engine.settings import RayConfig
from pipeline.runner import init_ray
init_ray(RayConfig(address=None, num_cpus=1))
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


def test_a_run_that_keeps_the_processs_ray_names_the_address_it_does_not_join(ray_session, capsys):
    import ray

    from pipeline.engine.settings import RayConfig
    from pipeline.runner import init_ray

    connected = ray.get_runtime_context().gcs_address
    init_ray(RayConfig(address="192.0.2.9:6379", num_cpus=1))
    out = capsys.readouterr().out
    assert "ray.address=192.0.2.9:6379 is not used" in out and connected in out and "ray.shutdown()" in out
    assert ray.get_runtime_context().gcs_address == connected  # still the same Ray
    for same_or_none in (None, "auto", connected):
        init_ray(RayConfig(address=same_or_none, num_cpus=1))
        assert capsys.readouterr().out == ""
