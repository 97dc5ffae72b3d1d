"""A stage's other use of Ray inside itself, beside the shard tasks (engine/shard_tasks.py): a few long-lived workers
(Ray actors) that each build what their jobs share once, in their own process (a stage's models loaded, a task
encoded), then take the stage's jobs one at a time, the next as soon as one finishes. The fine-tune stage trains its
runs on them side by side (finetune.parallel_runs): small models train more steps per second as several
single-thread runs than as one run on every thread.

A job's result must not depend on which worker ran it, nor on what that worker ran before: a job seeds its own
randomness (as every fine-tuning run does, from its seed)."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def size_torch_threads(threads: int) -> None:
    """torch's intra-op pool in this process sized to `threads`, set explicitly because Ray reuses worker processes
    across tasks and torch sizes its pool once, from the OMP_NUM_THREADS of the first task that imports it: after a
    one-CPU data stage, a training stage granted both cores ran on one (a fresh `make run` pretrained at 3.3-3.6
    steps/s against 6.1 with the data stages cached). So: resized here if this process has loaded torch already, else
    sized by OMP_NUM_THREADS when the process first imports it (data stages never do)."""
    threads = max(1, threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


class _Worker:
    """The actor: `make(*args)` built once, with `threads` torch threads, then called once per job."""

    def __init__(self, threads: int, make: Callable[..., Callable[[Any], Any]], *args) -> None:
        size_torch_threads(threads)
        self.work = make(*args)

    def run(self, job: Any) -> Any:
        return self.work(job)


class StageJobFailed(RuntimeError):
    """A job of a stage's workers failed: the message names the job; the worker's own error is its cause."""


class StageWorkers:
    """Up to `count` Ray actors of `cpus` CPUs each, each running `make(*args)` once, with `threads` torch threads,
    and then that object on each job it is handed. Started on the first `results` (no more than it has jobs for) and
    kept for the next, so what `make` loads is loaded once per worker, not once per job; ended on leaving the `with`
    block, which also ends the jobs still running when a job failed."""

    def __init__(self, count: int, cpus: float, threads: int, make: Callable[..., Callable[[Any], Any]], *args):
        self.count, self.cpus, self.threads, self.make, self.args = count, cpus, threads, make, args
        self.actors: list = []

    def __enter__(self) -> StageWorkers:
        return self

    def __exit__(self, *exc) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def results(self, jobs: Sequence[tuple[str, Any]]) -> Iterator[tuple[int, Any]]:
        """(i, result of jobs[i]) for each (name, job) of `jobs`, as the workers finish them, in the order given to
        the first free worker. A job that fails raises StageJobFailed naming it (from the worker's error, with its
        traceback)."""
        import ray

        worker = ray.remote(_Worker).options(num_cpus=self.cpus, max_restarts=0)
        while len(self.actors) < min(self.count, len(jobs)):
            self.actors.append(worker.remote(self.threads, self.make, *self.args))
        waiting = list(range(len(jobs)))[::-1]  # popped from the end: jobs[0] first
        idle, running = list(self.actors), {}
        while waiting or running:
            while idle and waiting:
                i, actor = waiting.pop(), idle.pop()
                running[actor.run.remote(jobs[i][1])] = i, actor
            (ref,), _ = ray.wait(list(running), num_returns=1)
            i, actor = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                raise StageJobFailed(f"{jobs[i][0]} failed in its Ray worker: {type(err.cause).__name__}: "
                                     f"{err.cause}") from err
            except ray.exceptions.RayActorError as err:  # the worker's process died: out of memory, killed
                raise StageJobFailed(f"{jobs[i][0]}: its Ray worker died: {err}") from err
            idle.append(actor)
            yield i, result
