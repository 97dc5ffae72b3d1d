"""The workflow engine: stages declared once, outputs cached by content hash, executed as Ray tasks.

Ray Workflows was removed from Ray (last in 2.47), so this layer is ours, small and explicit. It borrows caching
on by default from Kubeflow, resume-by-reusing-finished-steps from Metaflow and cache versions from Flyte (derived from
the stage's source code, not bumped by hand):
- a stage's output directory is `<cache_dir>/stages/<name>/<hash>/`, the hash covering the stage's config
  subset, its upstream hashes, the contents of its external input files and its code (pipeline/engine/fingerprints.py),
  so the same work is found again from any run directory, and changing e.g. a pretraining hyperparameter reruns
  pretraining and what follows it, not data prep;
- a stage is complete only once its marker is written, atomically, after its outputs; a crashed stage leaves
  no marker and is run again (into the same directory, so stages that checkpoint can resume);
- a stage whose input files changed after planning is not marked complete, and a finished stage's outputs are
  checked against the files its marker records before they are used again (pipeline/engine/integrity.py);
- a per-output file lock makes two concurrent runs of the same experiment wait for, then reuse, each other's work;
- a stage's output is readable by its owner alone (directories 700, files 600 or 700), whatever its inputs' modes.

What a stage prints is teed into its log (pipeline/engine/stage_log.py), a failure caused by the cache's disk says so
(pipeline/engine/disk_errors.py), and pipeline/engine/run_directory.py writes the run directory's links and
pipeline.json.
One file of ~500 lines because the graph, its keys, the markers and the execution share one contract (a stage is
complete only once its marker is written, under its lock, after outputs checked against its key), which reads best in
one place.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

from omegaconf import DictConfig, OmegaConf

from data_prep.corpus.shards import write_json_atomically
from pipeline.engine.disk_errors import failure_message
from pipeline.engine.fingerprints import code_version
from pipeline.engine.integrity import (
    OUTPUTS_KEY,
    InputFiles,
    InputsChanged,
    check_inputs_unchanged,
    damage_message,
    damaged_outputs,
    record_outputs,
)
from pipeline.engine.run_directory import link_stage, write_pipeline_file
from pipeline.engine.settings import StageSelection, cache_dir_of
from pipeline.engine.shard_tasks import shard_results
from pipeline.engine.stage_log import LOG_FILE, captured_output
from pipeline.engine.stage_workers import size_torch_threads

T = TypeVar("T")

MARKER = "_COMPLETE.json"
# A stage's output directory and what is in it are its owner's alone, whatever the inputs' modes and the umask: outputs
# hold what their inputs hold (books at mode 600 became shards at 644). Files keep only their owner's bits.
OWNER_ONLY_BITS = 0o700




@dataclass(frozen=True)
class Stage:
    name: str
    fn: Callable[["StageContext"], dict]
    # Stages whose outputs this one reads; a function of the config where that depends on the experiment (the
    # evaluate stage reads whichever encoders it is asked to compare).
    upstream: tuple[str, ...] | Callable[[DictConfig], tuple[str, ...]] = ()
    # dotted config paths that determine the stage's outputs; a function of the config where that depends on it
    config_keys: tuple[str, ...] | Callable[[DictConfig], tuple[str, ...]] = ()
    fingerprint: Callable[[DictConfig], str] | None = None  # identity of external inputs (files on disk)
    num_cpus: Callable[[DictConfig], float] = lambda cfg: 1




@dataclass
class StageContext:
    cfg: DictConfig
    name: str
    out_dir: Path
    inputs: dict[str, Path] = field(default_factory=dict)
    run_dir: Path | None = None
    wandb_run: object | None = None
    # shard index -> id of the Ray node whose task wrote that shard's output, for the stage's summary (stage.json)
    shard_nodes: dict[int, str] = field(default_factory=dict)

    def shard_results(self, fn: Callable[..., T], shards: Sequence, *args, **kwargs) -> Iterator[tuple[int, T]]:
        """(i, fn(i, shard, *args, **kwargs)) for each shard as its Ray task finishes (engine/shard_tasks.py),
        recording which node ran it."""
        for i, result, node in shard_results(fn, shards, *args, **kwargs):
            self.shard_nodes[i] = node
            yield i, result

    def map_shards(self, fn: Callable[..., T], shards: Sequence, *args, **kwargs) -> list[T]:
        """[fn(i, shard, *args, **kwargs) for i, shard in enumerate(shards)], one Ray task per shard."""
        results = dict(self.shard_results(fn, shards, *args, **kwargs))
        return [results[i] for i in range(len(shards))]

    @contextlib.contextmanager
    def scratch_dir(self) -> Iterator[Path]:
        """An empty directory for the stage's temporary files (a tokenised copy of the corpus), removed when the block
        ends. Beside the output directory, on the cache's disk (chosen for space, where /tmp may be a small tmpfs), and
        never in it: what a killed stage left there would be in the output a rerun finishes, recorded by its marker as
        an output. A rerun empties what a killed attempt left, under the stage's lock."""
        scratch = self.out_dir.parent / f"{self.out_dir.name}.scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(mode=OWNER_ONLY_BITS)
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def stage_dir(self, name: str) -> Path:
        """This stage's output directory, or an upstream stage's."""
        if name == self.name:
            return self.out_dir
        if name not in self.inputs:
            raise KeyError(f"stage {self.name} reads {name!r}, which is not one of its upstream stages "
                           f"{sorted(self.inputs)}; declare it in the stage's upstream")
        return self.inputs[name]


class StageFailed(RuntimeError):
    pass


def resolve_upstream(stages: dict[str, Stage], cfg: DictConfig) -> dict[str, Stage]:
    """The stage graph of this configuration: every upstream given as a tuple of stage names."""
    resolved = {n: s if isinstance(s.upstream, tuple) else replace(s, upstream=tuple(s.upstream(cfg)))
                for n, s in stages.items()}
    for name, stage in resolved.items():
        unknown = [u for u in stage.upstream if u not in resolved]
        if unknown:
            raise ValueError(f"stage {name} reads unknown stage(s) {unknown}; known: {list(resolved)}")
    return resolved


def topological_order(stages: dict[str, Stage]) -> list[str]:
    order, visiting, done = [], set(), set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            raise ValueError(f"stage graph has a cycle through {name!r}")
        visiting.add(name)
        for up in stages[name].upstream:
            visit(up)
        visiting.discard(name)
        done.add(name)
        order.append(name)

    for name in stages:
        visit(name)
    return order


def ancestors(stages: dict[str, Stage], name: str) -> set[str]:
    found, todo = set(), [name]
    while todo:
        for up in stages[todo.pop()].upstream:
            if up not in found:
                found.add(up)
                todo.append(up)
    return found


def descendants(stages: dict[str, Stage], name: str) -> set[str]:
    return {s for s in stages if name in ancestors(stages, s)}


def select_stages(stages: dict[str, Stage], wanted: list[str], until: str | None) -> list[str]:
    """The stages to execute in order: `wanted` (with the ancestors they need), cut at `until` if given."""
    chosen = set(wanted)
    for name in wanted:
        chosen |= ancestors(stages, name)
    if until:
        chosen &= ancestors(stages, until) | {until}
    return [s for s in topological_order(stages) if s in chosen]


def _config_subset(cfg: DictConfig, keys: tuple[str, ...]) -> dict:
    return {key: OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
            for key in keys for node in [OmegaConf.select(cfg, key, throw_on_missing=True)]}


def stage_keys(cfg: DictConfig, stages: dict[str, Stage],
               names: list[str]) -> tuple[dict[str, str], dict[str, InputFiles]]:
    """Each stage's hash (its cache key), and the input files its fingerprint digested for it."""
    stages = resolve_upstream(stages, cfg)
    hashes: dict[str, str] = {}
    input_files: dict[str, InputFiles] = {}
    for name in topological_order({n: stages[n] for n in _closure(stages, names)}):
        stage = stages[name]
        keys = stage.config_keys(cfg) if callable(stage.config_keys) else stage.config_keys
        fingerprint, input_files[name] = InputFiles.read(stage.fingerprint, cfg)
        payload = {"stage": name, "code": code_version(stage.fn), "config": _config_subset(cfg, keys),
                   "upstream": {up: hashes[up] for up in stage.upstream}, "inputs": fingerprint}
        hashes[name] = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return hashes, input_files


def stage_hashes(cfg: DictConfig, stages: dict[str, Stage], names: list[str]) -> dict[str, str]:
    return stage_keys(cfg, stages, names)[0]


def _closure(stages: dict[str, Stage], names: list[str]) -> set[str]:
    out = set(names)
    for n in names:
        out |= ancestors(stages, n)
    return out


def output_dir(cache_dir: str | Path, name: str, digest: str) -> Path:
    return Path(cache_dir) / "stages" / name / digest


def is_complete(out_dir: Path) -> bool:
    return (out_dir / MARKER).is_file()


def read_marker(out_dir: Path) -> dict | None:
    """A finished stage's completion marker: its summary and the files it wrote; None where it cannot be read."""
    try:
        marker = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def cached_summary(out_dir: Path) -> dict:
    """A finished stage's summary, as a run that reuses it reports it."""
    marker = read_marker(out_dir) or {}
    return {**{k: v for k, v in marker.items() if k != OUTPUTS_KEY}, "state": "cached"}


def output_damage(name: str, out_dir: Path, full: bool = False) -> list[str]:
    """How the finished output of stage `name` differs from what its marker records (integrity.damaged_outputs); the
    digests of files moved or copied since are memoised beside the output's lock."""
    marker = read_marker(out_dir)
    if marker is None:
        return [f"its completion marker {MARKER} cannot be read"]
    if OUTPUTS_KEY not in marker:
        return [f"its completion marker {MARKER} records no files (it was written by an older version of the "
                "pipeline)"]
    return damaged_outputs(out_dir, marker[OUTPUTS_KEY], (MARKER,), out_dir.parent / f"{out_dir.name}.digests.json",
                           full=full)


def check_outputs_intact(outputs: dict[str, Path], full: bool = False) -> None:
    """Raise StageFailed naming every file of the finished outputs `outputs` (stage -> directory) that is not what its
    stage wrote, with the pipeline.force that rebuilds each."""
    messages = [damage_message(name, out_dir, problems) for name, out_dir in outputs.items()
                if (problems := output_damage(name, out_dir, full))]
    if messages:
        raise StageFailed("\n".join(messages))


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Blocks while another process works on the same output; released by the OS if that process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)












@contextlib.contextmanager
def _failure_names_the_stage(cfg: DictConfig, name: str, log_path: Path) -> Iterator[None]:
    try:
        yield
    except BaseException as err:
        raise StageFailed(failure_message(cfg, name, err, log_path)) from err


def plain_config(cfg: DictConfig) -> DictConfig:
    """The config as stage code reads it: resolved, untyped, the schema's enums as their names (pipeline/config.py).
    What a Ray task is sent, and what a Lightning checkpoint's hyperparameters can hold: torch.load(weights_only=True),
    with which Lightning resumes, refuses the enum classes."""
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def stage_placement(ctx: StageContext) -> dict:
    """Where the stage ran, by Ray node id (`ray list nodes` gives each one's address): its own task's node and, for a
    stage mapped over the shards, the node that wrote each shard's output, in shard order."""
    import ray

    placement = {"node": ray.get_runtime_context().get_node_id()} if ray.is_initialized() else {}
    if ctx.shard_nodes:
        placement["shard_nodes"] = [ctx.shard_nodes[i] for i in sorted(ctx.shard_nodes)]
    return placement


def execute_stage(stages: dict[str, Stage], cfg: DictConfig, name: str, digest: str, out_dir: Path,
                  inputs: dict[str, tuple[Path, str]], run_dir: Path | None, forced: bool = False,
                  planned_inputs: InputFiles | None = None) -> dict:
    """Run one stage into its content-addressed directory, unless it is (or meanwhile became) complete; `forced`:
    replace a complete output, removing it only now that its replacement starts.

    `inputs` maps each upstream stage to (output directory, hash); each is checked against the files its marker
    records before the stage starts. `planned_inputs`: the stage's input files as its hash was computed from them (the
    plan's; by default, as they are now); the stage is refused if they differ before it starts or after it ends.
    Everything the stage prints also goes to `<out_dir>/stage.log`; a failure leaves no marker and raises StageFailed
    naming the stage and that log."""
    stage = stages[name]
    if planned_inputs is None:
        planned_inputs = InputFiles.read(stage.fingerprint, cfg)[1]
    return execute_stage_function(stage.fn, cfg, name, digest, out_dir, inputs, run_dir, forced, stage.fingerprint,
                                  planned_inputs)


def execute_stage_function(fn: Callable[[StageContext], dict], cfg: DictConfig, name: str, digest: str,
                           out_dir: Path, inputs: dict[str, tuple[Path, str]], run_dir: Path | None,
                           forced: bool = False, fingerprint: Callable[[DictConfig], str] | None = None,
                           planned_inputs: InputFiles = InputFiles({})) -> dict:
    """execute_stage with the stage's functions alone: what a Ray task is sent, so that its worker imports their
    module and no other stage's (a data stage's worker then never loads torch)."""
    from pipeline.engine.tracking import finish_stage_run, start_stage_run

    cfg = plain_config(cfg)
    log_path = out_dir / LOG_FILE
    # Around the lock and the marker too, whose writes a read-only or full cache refuses; outside the captured output,
    # so that a log the full disk cannot take still gives the message.
    with _failure_names_the_stage(cfg, name, log_path), exclusive_lock(out_dir.parent / f"{digest}.lock"):
        if is_complete(out_dir):
            if not forced:  # a concurrent run of the same experiment finished it while we waited
                return cached_summary(out_dir)
            # Rerun from scratch. Removing only the marker would let a stage that resumes (pretraining from its
            # checkpoints, fine-tuning from its finished runs) redo nothing.
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        make_private(out_dir, recursive=False)  # also an attempt's directory made before the cache was private
        with captured_output(log_path):
            print(f"stage {name}: running ({digest}) → {out_dir}", flush=True)
            try:
                # the finished ones: run_dag starts a stage only after its upstream stages finished
                check_outputs_intact({up: up_dir for up, (up_dir, _) in inputs.items() if is_complete(up_dir)})
                check_inputs_unchanged(fingerprint, cfg, planned_inputs, "since the run was planned")
            except BaseException:
                traceback.print_exc()
                raise
            tracker = start_stage_run(cfg, name, digest, run_dir, inputs)
            started = time.perf_counter()
            ctx = StageContext(cfg, name, out_dir, {k: v[0] for k, v in inputs.items()}, run_dir, tracker)
            try:
                summary = fn(ctx)
                check_inputs_unchanged(fingerprint, cfg, planned_inputs, "while the stage ran")
            except BaseException as err:
                traceback.print_exc()
                finish_stage_run(tracker, name, digest, out_dir, ok=False)
                if isinstance(err, InputsChanged):  # made from files its key does not describe: a rerun must not resume
                    _remove_outputs_but_the_log(out_dir)
                raise
            summary = {"stage": name, "hash": digest, "state": "ran", **summary,
                       "duration_s": round(time.perf_counter() - started, 1), **stage_placement(ctx)}
            write_json_atomically(out_dir / "stage.json", summary)
            finish_stage_run(tracker, name, digest, out_dir, ok=True, summary=summary)
            print(f"stage {name}: done in {summary['duration_s']} s", flush=True)
        make_private(out_dir)  # before the files' stat identities, which hold their modes, are recorded
        write_json_atomically(out_dir / MARKER, {**summary, "completed_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                 OUTPUTS_KEY: record_outputs(out_dir, (MARKER,))})
        make_private(out_dir / MARKER)
    return summary


def make_private(path: Path, recursive: bool = True) -> None:
    """`path`, and with `recursive` everything under it, readable by its owner alone: a stage's output holds what its
    inputs hold (a private book's sentences), and a copy of it (cp -a, tar, rsync) keeps these modes. Links are left
    alone: chmod would change what they point to."""
    entries = [path]
    if recursive and path.is_dir() and not path.is_symlink():
        entries += [Path(dirpath) / name for dirpath, dirnames, filenames in os.walk(path)
                    for name in dirnames + filenames]
    for entry in entries:
        if entry.is_symlink():
            continue
        try:
            entry.chmod(entry.stat().st_mode & OWNER_ONLY_BITS)
        except PermissionError:
            pass  # a file system without Unix modes (vfat, an SMB share) refuses chmod; its own permissions apply


def _remove_outputs_but_the_log(out_dir: Path) -> None:
    for path in out_dir.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.name != LOG_FILE:
            path.unlink()


def execute_stage_with_threads(threads: int, *args) -> dict:
    """execute_stage_function in a Ray worker, with torch's intra-op pool sized to the CPUs the stage was granted
    (size_torch_threads: Ray reuses worker processes, whose pool the first task that imported torch sized)."""
    size_torch_threads(threads)
    return execute_stage_function(*args)


def directory_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass
class Plan:
    stages: dict[str, Stage]  # the stage graph resolved for this configuration
    order: list[str]
    hashes: dict[str, str]
    dirs: dict[str, Path]
    cached: dict[str, bool]
    forced: set[str]  # pipeline.force and their descendants: rerun even if complete
    input_files: dict[str, InputFiles]  # the files outside the cache whose digests each stage's hash covers
    selection: StageSelection  # the `pipeline` block it was planned from

    def describe(self) -> str:
        lines = [f"{'stage':<12} {'state':<8} {'hash':<17} upstream → output"]
        for name in self.order:
            state = "cached" if self.cached[name] else "pending"
            ups = ",".join(self.stages[name].upstream) or "-"
            lines.append(f"{name:<12} {state:<8} {self.hashes[name]:<17} {ups} → {self.dirs[name]}")
        return "\n".join(lines)


def plan(cfg: DictConfig, stages: dict[str, Stage]) -> Plan:
    """What a run of `cfg` would execute: stages in order, their hashes, output dirs, and which are complete."""
    stages = resolve_upstream(stages, cfg)
    p = StageSelection.of(cfg)
    unknown = [s for s in [*p.stages, *p.force, *([p.until] if p.until else [])] if s not in stages]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; valid stages, in order: {topological_order(stages)}")
    order = select_stages(stages, list(p.stages), p.until)
    hashes, input_files = stage_keys(cfg, stages, order)
    dirs = {n: output_dir(cache_dir_of(cfg), n, hashes[n]) for n in order}
    forced = set(p.force)
    for name in list(forced):
        forced |= descendants(stages, name)
    cached = {n: is_complete(dirs[n]) and n not in forced for n in order}
    return Plan(stages, order, hashes, dirs, cached, forced, {n: input_files[n] for n in order}, p)








def _run_directory_removed(run_dir: Path, cfg: DictConfig, err: BaseException) -> str:
    """What a user reads when the run directory was removed mid-run (the driver's links and pipeline.json, a stage's
    lineage file could not be written there): one line, with what is kept, instead of a traceback; a stage's own
    failure follows it."""
    removed = (f"the run directory {run_dir} was removed while the run was going; the stages that finished are kept "
               f"in the cache (paths.cache_dir={cache_dir_of(cfg)}): rerun the same command, which reuses them")
    return removed + (f". {err}" if isinstance(err, StageFailed) else "")


def run_dag(cfg: DictConfig, stages: dict[str, Stage], run_dir: Path) -> dict[str, dict]:
    """Execute the plan on Ray: every stage whose upstream stages are complete is submitted as a Ray task."""
    import ray

    the_plan = plan(cfg, stages)
    stages = the_plan.stages
    if the_plan.selection.dry_run:
        print(the_plan.describe())
        return {}
    # Before any work: a damaged output would fail the run wherever it is first read, after the stages before it.
    check_outputs_intact({n: the_plan.dirs[n] for n in the_plan.order if the_plan.cached[n]},
                         full=the_plan.selection.verify)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_resolved = plain_config(cfg)
    remote = ray.remote(execute_stage_with_threads)
    results: dict[str, dict] = {}
    for name in the_plan.order:
        if the_plan.cached[name]:
            print(f"stage {name}: cached ({the_plan.hashes[name]})", flush=True)
            results[name] = cached_summary(the_plan.dirs[name])
            link_stage(run_dir, name, the_plan.dirs[name])
    # before any work: `python -m pipeline.status` sees a running run, whose reused stages are cached, not complete
    write_pipeline_file(run_dir, the_plan.order, the_plan.hashes, the_plan.dirs, results)
    pending = [n for n in the_plan.order if n not in results]
    running: dict = {}
    try:
        while pending or running:
            for name in [n for n in pending if all(u in results for u in stages[n].upstream)]:
                pending.remove(name)
                inputs = {u: (the_plan.dirs[u], the_plan.hashes[u]) for u in stages[name].upstream}
                cpus = stages[name].num_cpus(cfg)
                ref = remote.options(num_cpus=cpus, max_retries=0, name=f"stage:{name}") \
                    .remote(int(cpus), stages[name].fn, cfg_resolved, name, the_plan.hashes[name], the_plan.dirs[name],
                            inputs, run_dir, name in the_plan.forced, stages[name].fingerprint,
                            the_plan.input_files[name])
                running[ref] = name
            if not running:
                raise RuntimeError(f"stages {pending} wait on upstream stages that are not in this run")
            (ref,), _ = ray.wait(list(running), num_returns=1)
            name = running.pop(ref)
            try:
                results[name] = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                results[name] = {"state": "failed"}  # what pipeline.json records, as `python -m pipeline.status` says
                if isinstance(err.cause, StageFailed):  # its message names the stage and its log: enough
                    raise StageFailed(str(err.cause)) from None
                raise
            link_stage(run_dir, name, the_plan.dirs[name])
    except (FileNotFoundError, StageFailed) as err:
        if run_dir.is_dir():
            raise
        raise StageFailed(_run_directory_removed(run_dir, cfg, err)) from None
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        if run_dir.is_dir():  # one removed mid-run is said so above
            write_pipeline_file(run_dir, the_plan.order, the_plan.hashes, the_plan.dirs, results,
                                ended=True)
    return results
