"""A stage's workers (engine/stage_workers.py): what a worker builds is built once and kept for its next jobs, torch's
pool has the threads asked for, and a failed job fails the stage under the job's name."""
from __future__ import annotations

import os

import pytest

from pipeline.engine.stage_workers import StageJobFailed, StageWorkers


class _Adder:
    """A worker's object: built once per worker, counting the jobs it was handed."""

    def __init__(self, offset: int) -> None:
        self.offset, self.jobs = offset, 0

    def __call__(self, job: int) -> dict:
        import torch

        if job < 0:
            raise ValueError(f"job {job} is negative")
        self.jobs += 1
        return {"sum": job + self.offset, "pid": os.getpid(), "jobs": self.jobs, "threads": torch.get_num_threads()}


def test_each_worker_builds_once_and_takes_jobs_until_none_are_left(ray_session):
    with StageWorkers(2, 1, 2, _Adder, 10) as workers:  # 2 threads: not what Ray gives a 1-CPU worker
        first = dict(workers.results([(f"job {n}", n) for n in range(5)]))
        again = dict(workers.results([("job 7", 7)]))
    assert [first[i]["sum"] for i in range(5)] == [10, 11, 12, 13, 14]
    pids = {r["pid"] for r in first.values()}
    assert len(pids) <= 2 and os.getpid() not in pids
    # each worker's object saw every job of its own: built once per worker, not per job
    assert sorted(max(r["jobs"] for r in first.values() if r["pid"] == pid) for pid in pids) == sorted(
        sum(r["pid"] == pid for r in first.values()) for pid in pids)
    assert again[0]["pid"] in pids and again[0]["jobs"] > 1  # the workers are kept for the next jobs
    assert {r["threads"] for r in [*first.values(), *again.values()]} == {2}


def test_a_failed_job_fails_under_its_name_with_the_workers_error(ray_session):
    with StageWorkers(2, 1, 1, _Adder, 0) as workers, \
            pytest.raises(StageJobFailed, match=r"^job two failed in its Ray worker: ValueError: job -2 is negative"):
        dict(workers.results([("job one", 1), ("job two", -2), ("job three", 3)]))
