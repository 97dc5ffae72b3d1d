"""Progress lines for long stages: one line every `interval_s` seconds, never a redrawn bar.

A carriage-return progress bar turns into thousands of lines in a log file or a Ray job log; a line
every few seconds stays readable in both and still tells the user the stage is alive and when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressReporter:
    """Counts files and bytes done out of known totals, prints a progress line at most every
    `interval_s` seconds, and a summary line at the end.

    `clock` and `print_line` are injectable so tests need neither sleeps nor captured stdout.
    """

    def __init__(self, stage: str, total_files: int, total_bytes: int, *, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, print_line: Callable[[str], None] = print):
        self.stage = stage
        self.total_files = total_files
        self.total_bytes = total_bytes
        self.interval_s = interval_s
        self.files_done = 0
        self.bytes_done = 0
        self._clock = clock
        self._print = print_line
        self.started = clock()
        self._last_line = self.started

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self.started

    def update(self, files: int, num_bytes: int) -> None:
        """Adds work done; prints a progress line if `interval_s` has passed since the last one."""
        self.files_done += files
        self.bytes_done += num_bytes
        now = self._clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            self._print(self.progress_line())

    def progress_line(self) -> str:
        elapsed = self.elapsed_s
        rate = self.bytes_done / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            eta = _duration((self.total_bytes - self.bytes_done) / rate)
        else:
            eta = "unknown"
        return (f"{self.stage}: {self.files_done}/{self.total_files} files, "
                f"{self.bytes_done / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB, {rate / 1e6:.2f} MB/s, ETA {eta}")

    def finish(self, details: str) -> None:
        """Prints the summary line: totals, time and rate, then `details`."""
        elapsed = self.elapsed_s
        rate = self.bytes_done / elapsed if elapsed > 0 else 0.0
        self._print(f"{self.stage}: done, {self.files_done} files, {self.bytes_done / 1e6:.1f} MB in "
                    f"{_duration(elapsed)} ({rate / 1e6:.2f} MB/s); {details}")
