"""A cache entry is trusted only if what was read matches its key, and what is served is what was written.

Two checks the content-addressed cache (engine/dag.py) needs besides its keys:
- inputs: a stage's key covers the digests of the files it reads from outside the cache, taken when the run is
  planned; the stage reads them later. The digests are taken again just before the stage starts and once it has
  finished, and a stage whose files changed in between is refused, not marked complete under a key they no longer
  match (a book overwritten while `prepare` ran was served, restored, as `stage prepare: cached`);
- outputs: a finished stage records every file it wrote (size, sha256, and the stat identity that lets a later check
  skip the hashing, as git's index does) in its completion marker. Before a stage's outputs are used again, as
  cached or as another stage's input, they are checked against that record: a deleted, truncated, edited or added
  file is named, with the `pipeline.force` that rebuilds the stage (a deleted examples file trained on 188
  of 401 instances, exit 0).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from pipeline.engine.fingerprints import content_digest, content_digests, recorded_digests, stat_identity

# The key of the completion marker that holds the stage's files: relative path -> {bytes, sha256, stat}
OUTPUTS_KEY = "outputs"


def output_identity(st: os.stat_result) -> list[int]:
    """A finished output's stat identity: the device number left out, as the nodes that mount one network file system
    (a cluster's shared paths.cache_dir) number it differently."""
    return stat_identity(st)[1:]


@dataclass(frozen=True)
class InputFiles:
    """The files outside the cache that a stage's fingerprint digested (path -> sha256, or `unreadable`)."""
    files: dict[str, str]

    @classmethod
    def read(cls, fingerprint: Callable[[DictConfig], str] | None, cfg: DictConfig) -> tuple[str | None, InputFiles]:
        """The fingerprint's value for `cfg` and the files it digested."""
        if fingerprint is None:
            return None, cls({})
        with recorded_digests() as files:
            value = fingerprint(cfg)
        return value, cls(dict(files))

    def changes(self, now: InputFiles) -> list[str]:
        """Each file that differs between `self` (as planned) and `now`, with how."""
        changed = [f"{path} (removed)" for path in self.files if path not in now.files]
        changed += [f"{path} (added)" for path in now.files if path not in self.files]
        changed += [f"{path} (contents changed)" for path, digest in self.files.items()
                    if path in now.files and now.files[path] != digest]
        return changed


class InputsChanged(RuntimeError):
    pass


def check_inputs_unchanged(fingerprint: Callable[[DictConfig], str] | None, cfg: DictConfig, planned: InputFiles,
                           when: str) -> None:
    """Raise InputsChanged naming every input file that differs from what the run's plan hashed into the stage's key."""
    _, now = InputFiles.read(fingerprint, cfg)
    changed = planned.changes(now)
    if changed:
        listed = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
        raise InputsChanged(f"input files changed {when}: {listed}. The stage's cache key was computed from them as "
                            "they were when the run started, so its output would be filed under a key its inputs "
                            "no longer match; nothing was kept. Leave the files as they should be and rerun the "
                            "same command (the stage then runs under the key of its files as they are)")


def output_files(out_dir: Path, skip: tuple[str, ...]) -> list[str]:
    """Every file under `out_dir` (relative POSIX paths, sorted) but those named in `skip` at its top level. Links to
    directories are not followed: what they point to is not the stage's output."""
    found = []
    for dirpath, _, filenames in os.walk(out_dir):
        relative = Path(dirpath).relative_to(out_dir)
        found += [(relative / name).as_posix() for name in filenames if relative != Path(".") or name not in skip]
    return sorted(found)


def record_outputs(out_dir: Path, skip: tuple[str, ...]) -> dict[str, dict]:
    """What a finished stage wrote, file by file: size, sha256, and the stat identity under which that sha256 holds."""
    recorded = {}
    for name in output_files(out_dir, skip):
        path = out_dir / name
        recorded[name] = {"bytes": path.stat().st_size, "sha256": content_digest(path),
                          "stat": output_identity(path.stat())}
    return recorded


def damaged_outputs(out_dir: Path, recorded: dict[str, dict], skip: tuple[str, ...], memo_file: Path | None = None,
                    full: bool = False) -> list[str]:
    """Each way in which the files under `out_dir` differ from what its stage recorded when it finished: a file
    missing, of another size, with other contents, or not written by the stage. Contents are hashed only where a
    file's stat identity differs from the recorded one (a copied or moved cache; digests then memoised in `memo_file`),
    or, with `full`, everywhere (`pipeline.verify=true`, `python -m pipeline.status --verify`)."""
    problems, to_hash = [], []
    for name, entry in recorded.items():
        try:
            st = (out_dir / name).stat()
        except OSError:
            problems.append(f"{name} is missing (it had {entry['bytes']} bytes)")
            continue
        if st.st_size != entry["bytes"]:
            problems.append(f"{name} has {st.st_size} bytes where the stage wrote {entry['bytes']}")
        elif full or output_identity(st) != entry["stat"]:
            to_hash.append(name)
    paths = [out_dir / name for name in to_hash]
    digests = [content_digest(p) for p in paths] if full or memo_file is None else content_digests(paths, memo_file)
    problems += [f"{name} has other contents than the stage wrote (sha256 {digest[:12]}…, recorded "
                 f"{recorded[name]['sha256'][:12]}…)" for name, digest in zip(to_hash, digests)
                 if digest != recorded[name]["sha256"]]
    problems += [f"{name} was not written by the stage (added after it finished)"
                 for name in output_files(out_dir, skip) if name not in recorded]
    return problems


def damage_message(name: str, out_dir: Path, problems: list[str]) -> str:
    """What a user reads about a damaged output: every problem, and the rerun that rebuilds the stage."""
    listed = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
    return (f"the finished output of stage {name} in {out_dir} is not what the stage wrote: {listed}. Rerun with "
            f"pipeline.force=[{name}] to rebuild it (and what is made from it)")
