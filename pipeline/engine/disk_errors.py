"""What a failed stage's one-line error says when the cache directory's disk is the cause: full (ENOSPC, anywhere in
the chain of causes, a Ray task's included), read-only (EROFS), or nearly full (a failure torch reports only as
"unexpected pos"), with what to do about it.
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

from omegaconf import DictConfig

from pipeline.engine.settings import cache_dir_of

# With this little space left on the cache directory's disk, a failed stage has likely failed for want of more:
# torch.save reports a full disk only as "RuntimeError: [enforce fail at inline_container.cc] unexpected pos".
_NEARLY_FULL_BYTES = 64 << 20


def caused_by(err: BaseException | None, error_number: int) -> bool:
    """Whether `err` is an OSError of `error_number` (ENOSPC: a full disk), or was raised from one or while handling
    one (a log that could not take the traceback, a Ray task's error wrapping its cause)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno == error_number:
            return True
        cause = getattr(err, "cause", None)
        err = cause if isinstance(cause, BaseException) else err.__cause__ or err.__context__
    return False


def failure_message(cfg: DictConfig, name: str, err: BaseException, log_path: Path) -> str:
    cache_dir = Path(cache_dir_of(cfg)).resolve()
    free = shutil.disk_usage(cache_dir).free
    full = f"the cache directory paths.cache_dir={cache_dir} is full ({free / 1e6:.0f} MB free now)"
    advice = ("free space there or set paths.cache_dir to a bigger disk, then rerun the same command (finished stages "
              "are reused)")
    if caused_by(err, errno.ENOSPC):
        return f"stage {name} failed: no space left on device: {full}; {advice} (full log: {log_path})"
    if caused_by(err, errno.EROFS):
        return (f"stage {name} failed: the cache directory paths.cache_dir={cache_dir} is read-only: it serves the "
                "stages it has finished, but a stage to run writes there; set paths.cache_dir to a writable directory "
                "(a copy of this one keeps its finished stages), then rerun the same command")
    message = f"stage {name} failed: {type(err).__name__}: {err}"
    if free < _NEARLY_FULL_BYTES:
        message += f"; perhaps for want of space: {full}; {advice}"
    return f"{message} (full log: {log_path})"
