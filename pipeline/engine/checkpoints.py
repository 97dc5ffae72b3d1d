"""Where a pretraining stage's Lightning checkpoints live, how each is written (atomically, a full disk said as one,
the oldest pruned), and which one a run starts from: the newest of its own (a resume), else the file `ckpt_path`
names, whose content is in the stage's cache key.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig

from pipeline.engine.fingerprints import memoised_digests
from pipeline.engine.settings import cache_dir_of

CHECKPOINT_DIR = "checkpoints"
KEEP_CHECKPOINTS = 2
STARTS_FROM_CKPT_PATH = "pretrain"  # the settings block of the training that ckpt_path starts


# Less than this left on a checkpoint's disk when its save failed: the disk was full.
_FULL_BYTES = 1 << 20


class AtomicCheckpointIO(TorchCheckpointIO):
    """A checkpoint appears under its name only once fully written, and only the newest `keep` stay.

    A kill mid-save leaves the previous checkpoints intact. Pruning lives here rather than in ModelCheckpoint's
    top-k, which forgets the checkpoints of the run before a resume."""

    def __init__(self, keep: int):
        super().__init__()
        self.keep = keep

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as err:
            # Measured before the temporary file gives its space back. A failed save used to leave it: 7.6 MB on a
            # 20 MiB volume, and every rerun added another, so that a rerun which would fit failed again.
            free = shutil.disk_usage(path.parent).free
            written = tmp.stat().st_size if tmp.exists() else 0
            tmp.unlink(missing_ok=True)
            if free < _FULL_BYTES and not (isinstance(err, OSError) and err.errno == errno.ENOSPC):
                # torch.save reports a full disk as "RuntimeError: [enforce fail at inline_container.cc] unexpected
                # pos": said as the full disk it is, the stage's error names paths.cache_dir (engine/disk_errors.py)
                raise OSError(errno.ENOSPC, f"no space left on device for checkpoint {path} ({written / 1e6:.1f} MB "
                                            f"written, {free / 1e6:.2f} MB free): {err}") from err
            raise
        for old in sorted(path.parent.glob("step-*.ckpt"))[:-self.keep]:  # zero-padded: name order is step order
            old.unlink()


def latest_checkpoint(out_dir: Path) -> Path | None:
    checkpoints = sorted((out_dir / CHECKPOINT_DIR).glob("step-*.ckpt"))  # zero-padded: name order is step order
    return checkpoints[-1] if checkpoints else None


def step_of(checkpoint: str) -> int:
    return int(Path(checkpoint).name.removeprefix("step-").split(".")[0])


def start_checkpoint_fingerprint(cfg: DictConfig) -> str:
    """The content of the checkpoint `ckpt_path` names (memoised by the file's identity): new weights at the same
    path are new work."""
    if not cfg.ckpt_path:
        return ""
    path = Path(cfg.ckpt_path).expanduser().resolve()
    return memoised_digests([path], cache_dir_of(cfg), str(path))[0]


def check_start_checkpoint(cfg: DictConfig) -> None:
    if cfg.ckpt_path and not Path(cfg.ckpt_path).expanduser().is_file():
        raise FileNotFoundError(f"ckpt_path={cfg.ckpt_path} is not a file; point it at a Lightning checkpoint (.ckpt, "
                                "e.g. a pretraining stage's checkpoints/step-*.ckpt), or leave it null")
