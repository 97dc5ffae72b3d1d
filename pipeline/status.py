"""`python -m pipeline.status [RUN_DIR]`: what each stage of a run did, read from disk without starting anything.

The run directory's `pipeline.json` (written by dag.run_dag) names every planned stage and its content-addressed
output directory; the output directory tells the rest, because the engine's own files are the truth there:
the marker (complete), `stage.json` (duration), `stage.log` (a traceback means the stage failed), and the
per-output lock (held only while a process is executing the stage). Without RUN_DIR, the newest run under
`outputs/` or `multirun/` is shown. With --verify, every file of each finished stage is hashed again and compared
with what the stage recorded in its marker when it finished (pipeline/engine/integrity.py); each mismatch is listed.

Exit status: 0 when no stage failed, was interrupted or had its output deleted from the cache after the run finished
it (and, with --verify, no finished output differs from its record), 1 when one did (rerun the same command to retry
it; a damaged output, with the pipeline.force it names) or when there is no run to show, so that scripts can test a run
with it.
"""
from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.engine.dag import MARKER, directory_size, output_damage
from pipeline.engine.integrity import damage_message
from pipeline.engine.run_directory import process_start
from pipeline.engine.stage_log import LOG_FILE

PIPELINE_FILE = "pipeline.json"
FINISHED = ("complete", "cached")
FINISHED_IN_PIPELINE_FILE = ("ran", "cached")  # what dag.run_dag records for a stage it ran or reused
# The states `python -m pipeline.status` exits 1 for: a rerun of the same command does the stage again
NEEDS_A_RERUN = ("failed", "interrupted", "deleted")
RUN_ROOTS = ("outputs", "multirun")  # where Hydra puts single runs and sweeps (conf/config.yaml)


@dataclass(frozen=True)
class StageStatus:
    name: str
    state: str             # complete | cached | running | failed | interrupted | deleted | not run
    hash: str
    output: Path
    duration_s: float | None
    size_bytes: int | None

    @property
    def log(self) -> Path:
        return self.output / LOG_FILE


def latest_run_dir(roots: tuple[Path, ...]) -> Path:
    """The run directory whose pipeline.json was written last."""
    candidates = [p for root in roots if root.is_dir() for p in root.rglob(PIPELINE_FILE)]
    if not candidates:
        raise FileNotFoundError(f"no {PIPELINE_FILE} under {', '.join(str(r) for r in roots)}: run the pipeline "
                                "first (python -m pipeline +experiment=bert_tiny), or pass a run directory")
    return max(candidates, key=lambda p: p.stat().st_mtime).parent


def _lock_is_held(lock_path: Path) -> bool:
    """True while another process executes the stage: dag.execute_stage holds this flock for the whole stage."""
    if not lock_path.is_file():
        return False
    with open(lock_path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EACCES):
                return True
            raise
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _last_attempt_failed(log_path: Path, name: str) -> bool:
    """The log is appended to by every attempt; only the output after the last start line counts."""
    if not log_path.is_file():
        return False
    log = log_path.read_text(errors="replace")
    last_attempt = log[log.rfind(f"stage {name}: running"):]
    return "Traceback (most recent call last)" in last_attempt


def stage_state(name: str, digest: str, output: Path, recorded_state: str) -> str:
    if (output / MARKER).is_file():
        return "cached" if recorded_state == "cached" else "complete"
    if _lock_is_held(output.parent / f"{digest}.lock"):
        return "running"
    if not output.is_dir():
        # the run finished it, and its output has gone from the cache since (cleaned by hand, a cache restored)
        return "deleted" if recorded_state in FINISHED_IN_PIPELINE_FILE else "not run"
    # Started, never finished: an exception leaves its traceback in the log, a killed process leaves none.
    return "failed" if _last_attempt_failed(output / LOG_FILE, name) else "interrupted"


def _read_json(path: Path) -> dict | None:
    """A JSON file's object, or None where there is none or it does not parse (a truncated or damaged file)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _is_stage_record(recorded) -> bool:
    """A stage's entry as dag.run_dag writes it into pipeline.json: its hash, output directory and state."""
    return isinstance(recorded, dict) and all(isinstance(recorded.get(key), str) for key in ("hash", "output", "state"))


def read_status(run_dir: Path) -> list[StageStatus]:
    pipeline_file = run_dir / PIPELINE_FILE
    if not pipeline_file.is_file():
        raise FileNotFoundError(f"{pipeline_file} not found: {run_dir} is not a pipeline run directory, or its "
                                "run is still planning or was killed before it wrote one; pass the directory "
                                "that `python -m pipeline` printed as 'run directory:'")
    planned = _read_json(pipeline_file)
    stages = planned.get("stages") if planned is not None else None
    if not isinstance(stages, dict) or not all(_is_stage_record(recorded) for recorded in stages.values()):
        raise ValueError(f"{pipeline_file} is not a readable pipeline file (truncated or damaged); rerun the same "
                         "command to write it again (finished stages are reused)")
    statuses = []
    for name, recorded in stages.items():
        output = Path(recorded["output"])
        state = stage_state(name, recorded["hash"], output, recorded["state"])
        # For a cached stage this is how long the run that produced the output took: the work it saved. A stage.json
        # that cannot be read gives none (`--verify` names it).
        duration = (_read_json(output / "stage.json") or {}).get("duration_s")
        size = directory_size(output) if output.is_dir() else None
        statuses.append(StageStatus(name, state, recorded["hash"], output, duration, size))
    return statuses


def killed_driver(run_dir: Path) -> str | None:
    """How the run's driver ended without finishing the run (killed by SIGKILL, or its machine), or None: it got to the
    end, it is still running, or it ran on another machine, where this cannot be told."""
    planned = _read_json(run_dir / PIPELINE_FILE) or {}
    driver = planned.get("driver")
    if planned.get("ended", True) or not driver or driver.get("host") != socket.gethostname():
        return None
    if driver.get("started") is None:  # no /proc to tell a reused pid apart: whether one runs under it
        try:
            os.kill(driver["pid"], 0)
            return None
        except ProcessLookupError:
            pass
        except PermissionError:  # another user's process: one runs under it
            return None
    elif process_start(driver["pid"]) == driver["started"]:
        return None
    return (f"run interrupted: its driver (pid {driver['pid']}) ended without finishing the run (killed?); stages "
            "still running are left to finish or fail, the others were not started. Rerun the same command to resume "
            "(finished stages are reused)")


def verify(statuses: list[StageStatus]) -> list[str]:
    """A message for each finished stage whose files are not what it recorded when it finished, naming every file."""
    return [damage_message(s.name, s.output, problems) for s in statuses if s.state in FINISHED
            if (problems := output_damage(s.name, s.output, full=True))]


def human_bytes(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"


def human_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def format_table(run_dir: Path, statuses: list[StageStatus]) -> str:
    header = ("stage", "state", "hash", "duration", "size", "output")
    rows = [(s.name, s.state, s.hash, human_duration(s.duration_s) if s.duration_s is not None else "-",
             human_bytes(s.size_bytes) if s.size_bytes is not None else "-", str(s.output)) for s in statuses]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = [f"run: {run_dir}"]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    for s in statuses:
        if s.state == "deleted":
            lines.append(f"{s.name} deleted: the run finished it, and its output {s.output} is gone from the cache; "
                         "rerun the same command to make it again (finished stages are reused)")
        elif s.state in NEEDS_A_RERUN:
            lines.append(f"{s.name} {s.state}: see {s.log}; rerun the same command to retry it "
                         "(finished stages are reused)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.status", description=__doc__.splitlines()[0],
                                     epilog=__doc__.split("\n\n")[-1])
    parser.add_argument("run_dir", nargs="?", type=Path,
                        help=f"a run directory (default: the newest under {' or '.join(RUN_ROOTS)}/)")
    parser.add_argument("--verify", action="store_true",
                        help="hash every file of the finished stages again and list each one that differs from what "
                             "its stage recorded")
    args = parser.parse_args(argv)
    try:
        run_dir = args.run_dir or latest_run_dir(tuple(Path(r) for r in RUN_ROOTS))
        statuses = read_status(run_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(format_table(run_dir, statuses))
    failed = any(s.state in NEEDS_A_RERUN for s in statuses)
    if killed := killed_driver(run_dir):
        print(killed)
        failed = True
    if args.verify:
        damaged = verify(statuses)
        checked = sum(s.state in FINISHED for s in statuses)
        print("\n".join(f"damaged: {message}" for message in damaged) if damaged else
              f"verified: the files of all {checked} finished stages are what their stages wrote")
        failed = failed or bool(damaged)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
