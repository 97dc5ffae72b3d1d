"""Everything a stage prints, on the console and in its log (`<out_dir>/stage.log`): sys.stdout and sys.stderr
teed while the stage runs.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

LOG_FILE = "stage.log"


class _Tee:
    """sys.stdout or sys.stderr while a stage runs: the console and the stage's log. A library may keep the stream it
    found (absl's log handler, made when absl is first imported during a stage, holds sys.stderr for good), so the tee
    outlives the stage: then it writes to the console alone, past the closed log, and its close() leaves both streams
    to their owners (logging's reconfiguration, as a later Hydra job in the same Ray worker does, closes every
    handler's stream: a tee without close() failed that job)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, data):
        for s in self.streams:
            if not s.closed:
                s.write(data)
        return len(data)

    def flush(self):
        for s in self.streams:
            if not s.closed:
                s.flush()

    def close(self):
        pass

    def isatty(self):
        return False


@contextlib.contextmanager
def captured_output(log_path: Path) -> Iterator[None]:
    with open(log_path, "a", buffering=1) as log:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err
