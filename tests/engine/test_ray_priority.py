"""How a run starts or joins Ray: its local Ray runs the stage tasks at the driver's own priority, not at Ray's default
nice 15; a Ray the process already holds is kept, and an address the run then does not join is named."""
from __future__ import annotations

import os


def test_stage_tasks_run_at_the_driver_priority(ray_session):
    """The session's Ray is started as a run starts its own (pipeline.runner.start_local_ray), so its workers are the
    ones a run's stages get; a fresh Ray in a subprocess, as this test once started, took over its 120 s on a loaded
    machine."""
    import ray

    assert ray.get(ray.remote(lambda: os.nice(0)).remote()) == os.nice(0)


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
