"""Time and memory of each data stage of the real pipeline on a corpus (at 1 GB and 2 GB, the whole process
tree under 3 GB, no stage's memory growing with the corpus, throughput per worker near the 66 MB figure).

    python benchmarks/bench_stages.py --corpus /tmp/scale-1GB [--families bert elmo skip_thought] [--json-out F]
    python benchmarks/bench_stages.py --corpus DIR --serial -- data.shard_bytes=4_000_000

runs `python -m pipeline` with data.corpus_dir=DIR on prepare and the chosen families' data stages (BERT: tokenizer,
examples; ELMo: elmo_vocab, elmo_streams; Skip-Thought: skip_thought_vocab, skip_thought_examples; no pretraining),
into a fresh cache directory unless --cache-dir names one (a stage found there complete is not run: it shows as
cached). Hydra overrides after `--` go to the pipeline as they are; logger=csv is the default, as W&B's service
process would add its memory to the tree without being a data stage.

Every 0.2 s the parent samples
- the RSS of the pipeline's whole process tree (psutil, recursively: the driver, Ray's GCS, raylet and agents, every
  worker), the sum of VmRSS from /proc/<pid>/status, as `ps` shows it and as bench_data.py reports it. Pages shared
  between processes (libraries; object-store pages a process has touched, its RssShmem) count once per process that
  maps them, so this overstates the memory in use: it is the figure to hold under a budget;
- the object store: the bytes Ray's raylet reports in use (GetNodeStats' store_stats, what `ray memory --stats-only`
  prints), asked over gRPC from the GCS address on the raylet's command line. Ray's object store is a file in
  /dev/shm, unlinked at creation, so no listing of /dev/shm shows it, and `df /dev/shm` counts every other user's
  shared memory too;
- the total: the tree's RSS without its shared-memory pages, plus the object store counted once by Ray's figure.

Each sample goes to the stages running when it was taken, from the "stage NAME: running" and "done in" lines the
stages print (they reach the driver through Ray's log forwarding, within about a second; a line Ray drops is made up
from the stage's stage.json, whose duration is the table's wall time). In one run (the default), as in `make run`,
stages that do not depend on each other share the workers: a stage's peak is then that of the tree while it ran,
and the table names the stages that ran alongside. --serial runs one `python -m pipeline` per stage on the same cache
directory, so each stage's peak is its own (Ray's start-up, between the stages, is in no stage).
MB/s per worker is the corpus's raw bytes over the stage's wall time over ray.num_cpus (--workers). Local Ray only:
the tree is this machine's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SAMPLE_SECONDS = 0.2
# each family's stages between prepare and pretraining (pipeline/<family>/pretrain.py lists them)
DATA_STAGES = {"bert": ("bert_tokenizer", "bert_examples"), "elmo": ("elmo_vocab", "elmo_streams"),
               "skip_thought": ("skip_thought_vocab", "skip_thought_examples"),
               "gpt": ("gpt_tokenizer", "gpt_blocks")}
# printed by pipeline/engine/dag.py, in a Ray worker ("(stage:prepare pid=12) stage prepare: running (...) → ...")
# or, for "cached", in the driver
_STAGE_LINE = re.compile(r"\bstage (\w+): (running|done in [0-9.]+ s|cached)")


@dataclass(frozen=True)
class Sample:
    t: float          # seconds since the benchmark started
    rss: int          # the process tree's summed RSS
    shmem: int        # the part of it that is shared memory
    store: int        # bytes in use in Ray's object store
    processes: int    # in the tree: the driver, Ray's daemons and as many workers as Ray has started
    roles: tuple[tuple[str, int], ...] = ()  # (role, summed RSS of the tree's processes in that role): process_role

    @property
    def total(self) -> int:
        return self.rss - self.shmem + self.store


@dataclass
class Run:
    """What one `python -m pipeline` left: its samples, its stage lines (seconds, stage, event), its times, and
    each stage's entry in its pipeline.json (state: ran, cached, ...; duration_s)."""
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    stages: dict[str, dict] = field(default_factory=dict)


def parse_stage_line(line: str) -> tuple[str, str] | None:
    """(stage, "running" | "done" | "cached") for a stage's start or end line of the pipeline, else None."""
    match = _STAGE_LINE.search(line)
    return (match.group(1), match.group(2).split()[0]) if match else None


def stage_intervals(events: list[tuple[float, str, str]], durations: dict[str, float],
                    end: float) -> dict[str, tuple[float, float]]:
    """When each stage ran: from its start line to its done line. Where Ray dropped one of the two, the stage's own
    duration places the other; a stage that never finished (the run failed) runs until `end`."""
    starts = {stage: t for t, stage, event in events if event == "running"}
    ends = {stage: t for t, stage, event in events if event == "done"}
    intervals = {}
    for stage in [*starts, *(s for s in ends if s not in starts)]:
        start, stop = starts.get(stage), ends.get(stage)
        if start is None:
            start = stop - durations.get(stage, 0.0)
        if stop is None:
            stop = min(start + durations[stage], end) if stage in durations else end
        intervals[stage] = (start, stop)
    return intervals


def stage_peaks(samples: list[Sample], intervals: dict[str, tuple[float, float]]) -> dict[str, dict]:
    """Per stage, the highest RSS, object store and total of the samples taken while it ran, and the stages that ran
    at the same time; a stage too short for any sample has no peaks."""
    peaks = {}
    for stage, (start, stop) in intervals.items():
        inside = [s for s in samples if start <= s.t <= stop]
        alongside = [other for other, (o_start, o_stop) in intervals.items()
                     if other != stage and o_start < stop and start < o_stop]
        peaks[stage] = {"peak_rss": max((s.rss for s in inside), default=None),
                        "peak_store": max((s.store for s in inside), default=None),
                        "peak_total": max((s.total for s in inside), default=None),
                        "peak_processes": max((s.processes for s in inside), default=None),
                        "samples": len(inside), "alongside": alongside}
    return peaks


def _status_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, RssShmem) of a process in bytes, from /proc/<pid>/status."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "RssShmem:")):
                key, value = line.split(":")
                found[key] = int(value.split()[0]) * 1024
    return found.get("VmRSS", 0), found.get("RssShmem", 0)


def tree_of(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:  # the root has ended
        return []


class ObjectStore:
    """Bytes in use in the object store of the Ray whose raylet is in a process tree, as that raylet reports them.
    Asked from a thread of its own (watch): finding the raylet waits on Ray's start-up, which must not hold up the
    RSS samples."""

    def __init__(self):
        self.node = None  # (address, port) of the raylet's node manager, once the raylet has registered
        self.bytes = 0    # the latest answer

    def watch(self, root: psutil.Process, done: threading.Event) -> None:
        while not done.is_set():
            self.bytes = self.used(tree_of(root))
            done.wait(SAMPLE_SECONDS)

    def used(self, tree: list[psutil.Process]) -> int:
        from ray._private.internal_api import node_stats

        if self.node is None:
            self.node = self._find_node(tree)
            if self.node is None:
                return 0
        try:
            return node_stats(*self.node, include_memory_info=False).store_stats.object_store_bytes_used
        except Exception:  # grpc's errors while the raylet starts or stops: no store to count
            return 0

    @staticmethod
    def _find_node(tree: list[psutil.Process]) -> tuple[str, int] | None:
        from ray._private.internal_api import get_state_from_address

        for process in tree:
            try:
                if process.name() != "raylet":
                    continue
                gcs = [arg.split("=", 1)[1] for arg in process.cmdline() if arg.startswith("--gcs-address=")]
            except psutil.Error:
                continue
            try:
                nodes = [n for n in get_state_from_address(gcs[0]).node_table() if n["Alive"]]
            except Exception:  # the GCS not answering yet
                return None
            return (nodes[0]["NodeManagerAddress"], nodes[0]["NodeManagerPort"]) if nodes else None
        return None


def process_role(process: psutil.Process, root: psutil.Process) -> str:
    """What a process of the tree is: "driver" (python -m pipeline), a Ray worker by the task it runs as Ray titles it
    ("ray::stage:examples", "ray::_on_node" for a shard task, "ray::IDLE"), a Ray daemon by its executable
    ("raylet", "gcs_server") or by its Python script ("agent.py", "log_monitor.py", ...)."""
    if process.pid == root.pid:
        return "driver"
    name = process.name()
    cmdline = process.cmdline()
    if cmdline and cmdline[0].startswith("ray::"):
        return cmdline[0].split()[0]
    scripts = [Path(arg).name for arg in cmdline if arg.endswith(".py")]
    return scripts[0] if name.startswith("python") and scripts else name


def sample_tree(root: psutil.Process, t0: float, store_bytes: int = 0) -> Sample:
    """The tree's RSS now, by process role too, with the object store's latest figure."""
    tree = tree_of(root)
    rss = shmem = 0
    roles: dict[str, int] = {}
    for process in tree:
        try:
            process_rss, process_shmem = _status_bytes(process.pid)
            role = process_role(process, root)
        except (OSError, psutil.Error):  # it ended between the listing and the read
            continue
        rss += process_rss
        shmem += process_shmem
        roles[role] = roles.get(role, 0) + process_rss
    return Sample(time.monotonic() - t0, rss, shmem, store_bytes, len(tree), tuple(sorted(roles.items())))


def run_pipeline(overrides: list[str], run_dir: Path, log, t0: float) -> Run:
    """One `python -m pipeline` with these overrides into `run_dir`, sampled until it exits; its output is appended
    to `log`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    run = Run(started=time.monotonic() - t0)
    overrides = [*overrides, f"hydra.run.dir={run_dir}"]
    child = psutil.Popen([sys.executable, "-m", "pipeline", *overrides], cwd=REPO, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    done = threading.Event()
    store = ObjectStore()

    def sample():
        while not done.is_set():
            run.samples.append(sample_tree(child, t0, store.bytes))
            done.wait(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    watcher = threading.Thread(target=store.watch, args=(child, done), daemon=True)
    sampler.start()
    watcher.start()
    for line in child.stdout:
        log.write(line)
        event = parse_stage_line(line)
        if event:
            run.events.append((time.monotonic() - t0, *event))
            print(line.rstrip(), flush=True)
    child.wait()
    done.set()
    sampler.join()
    watcher.join()
    run.ended = time.monotonic() - t0
    if child.returncode:
        log.flush()
        raise SystemExit(f"python -m pipeline {' '.join(overrides)} failed with exit code {child.returncode}; its "
                         f"output is in {log.name}")
    run.stages = json.loads((run_dir / "pipeline.json").read_text())["stages"]
    return run


def report(runs: list[Run], stages: list[str], corpus_bytes: int, workers: int) -> dict:
    """The per-stage rows and the whole run's, as the JSON written by --json-out."""
    samples = [s for run in runs for s in run.samples]
    events = [e for run in runs for e in run.events]
    states, durations = {}, {}
    for run in runs:  # --serial: a stage ran in one run and is cached in the later ones
        for stage, entry in run.stages.items():
            if entry["state"] == "ran":
                states[stage], durations[stage] = "ran", float(entry["duration_s"])
            else:
                states.setdefault(stage, entry["state"])
    peaks = stage_peaks(samples, stage_intervals(events, durations, runs[-1].ended))
    rows = {}
    for stage in stages:
        seconds = durations.get(stage)
        rows[stage] = {"state": states.get(stage, "not run"), "seconds": seconds,
                       "mb_per_s_per_worker": corpus_bytes / 1e6 / seconds / workers if seconds else None,
                       **peaks.get(stage, {})}
    seconds = sum(run.ended - run.started for run in runs)
    whole = {"seconds": seconds, "mb_per_s_per_worker": corpus_bytes / 1e6 / seconds / workers,
             "peak_rss": max((s.rss for s in samples), default=None),
             "peak_store": max((s.store for s in samples), default=None),
             "peak_total": max((s.total for s in samples), default=None),
             "peak_processes": max((s.processes for s in samples), default=None), "samples": len(samples),
             # who holds the memory at the peak: the per-role sums of the sample with the largest tree RSS
             "rss_by_role_at_peak": dict(max(samples, key=lambda s: s.rss).roles) if samples else {}}
    return {"stages": rows, "run": whole, "corpus_bytes": corpus_bytes, "workers": workers,
            "sample_seconds": SAMPLE_SECONDS,
            "samples": [[round(s.t, 2), s.rss, s.shmem, s.store, s.processes] for s in samples]}


def format_table(result: dict) -> str:
    def gb(value):
        return f"{value / 1e9:.2f}" if value is not None else "-"

    def mb(value):
        return f"{value / 1e6:.0f}" if value is not None else "-"

    header = ("stage", "wall s", "MB/s/worker", "peak RSS GB", "peak store MB", "peak total GB", "processes",
              "ran alongside")
    lines = []
    for stage, row in [*result["stages"].items(), ("whole run", {**result["run"], "state": "ran"})]:
        if row["state"] != "ran":
            lines.append((stage, row["state"], "", "", "", "", "", ""))
            continue
        lines.append((stage, f"{row['seconds']:.1f}", f"{row['mb_per_s_per_worker']:.3g}", gb(row.get("peak_rss")),
                      mb(row.get("peak_store")), gb(row.get("peak_total")), str(row.get("peak_processes", "-")),
                      ", ".join(row.get("alongside", []))))
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(f"{cell:<{w}}" if i in (0, 7) else f"{cell:>{w}}" for i, (cell, w)
                               in enumerate(zip(line, widths))).rstrip() for line in [header, *lines])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="directory of .txt books (data.corpus_dir)")
    parser.add_argument("--cache-dir", type=Path,
                        help="the pipeline's paths.cache_dir, kept afterwards (default: a fresh one, removed)")
    parser.add_argument("--families", nargs="+", choices=list(DATA_STAGES), default=["bert", "elmo", "skip_thought"],
                        help="whose data stages run after prepare")
    parser.add_argument("--workers", type=int, default=2, help="ray.num_cpus")
    parser.add_argument("--serial", action="store_true", help="one pipeline run per stage: each stage's peak alone")
    parser.add_argument("--json-out", type=Path, help="also write the table, and every sample, as JSON here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the pipeline, after --")
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        parser.error(f"--corpus {args.corpus} is not a directory; benchmarks/make_scale_corpus.py builds one")
    args.stages = ["prepare", *(stage for family in args.families for stage in DATA_STAGES[family])]
    return args


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_stages_"))
    cache_dir = args.cache_dir or work / "cache"
    common = [f"data.corpus_dir={args.corpus.resolve()}", f"paths.cache_dir={cache_dir}",
              f"ray.num_cpus={args.workers}", "logger=csv", *args.overrides]
    plan = [[stage] for stage in args.stages] if args.serial else [args.stages]
    t0 = time.monotonic()
    with open(work / "pipeline.log", "w") as log:
        runs = [run_pipeline([*common, f"pipeline.stages=[{','.join(stages)}]"], work / f"run{i}", log, t0)
                for i, stages in enumerate(plan)]
    corpus_bytes = sum(p.stat().st_size for p in args.corpus.glob("**/*.txt") if p.is_file())
    result = report(runs, args.stages, corpus_bytes, args.workers)
    result.update(corpus=str(args.corpus), serial=args.serial, overrides=common)
    print(f"\ncorpus {args.corpus}: {corpus_bytes / 1e6:.1f} MB; {args.workers} workers; "
          f"{'one run per stage' if args.serial else 'one run'}; load average {os.getloadavg()}")
    print(format_table(result))
    print("RSS by process at the whole run's peak: " + ", ".join(
        f"{role} {rss / 1e6:.0f} MB" for role, rss in sorted(result["run"]["rss_by_role_at_peak"].items(),
                                                              key=lambda item: -item[1])))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
