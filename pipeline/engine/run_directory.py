"""What a run leaves in its run directory: a link per stage to its output in the cache, and pipeline.json, the run's
stages with their hashes, outputs and states, and its driver (host, pid and its start), from which
`python -m pipeline.status` tells a running run from a finished or a killed one.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from data_prep.corpus.shards import write_json_atomically


def link_stage(run_dir: Path, name: str, target: Path) -> None:
    link = run_dir / name
    if link.is_symlink() or link.exists():
        if link.is_symlink() and link.resolve() == target.resolve():
            return
        link.unlink()
    link.symlink_to(target, target_is_directory=True)


def process_start(pid: int) -> str | None:
    """When process `pid` started (Linux: clock ticks since boot, /proc/PID/stat's 22nd field), which tells a pid that
    was reused apart; None where it is not running or this cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def write_pipeline_file(run_dir: Path, order: list[str], hashes: dict[str, str], dirs: dict[str, Path],
                        results: dict[str, dict], ended: bool = False) -> None:
    """`ended`: the driver got to the end of the run (finished, failed or interrupted by a signal it caught); without
    it, and with the driver gone, `python -m pipeline.status` knows the run was killed (SIGKILL) mid-way."""
    write_json_atomically(run_dir / "pipeline.json", {
        "driver": {"host": socket.gethostname(), "pid": os.getpid(), "started": process_start(os.getpid())},
        "ended": ended,
        "stages": {n: {"hash": hashes[n], "output": str(dirs[n]),
                       "state": results.get(n, {}).get("state", "not run"),
                       "duration_s": results.get(n, {}).get("duration_s")} for n in order}})
