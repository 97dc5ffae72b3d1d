"""Killing a run never leaves output that looks finished, and running the same command again completes the work:
SIGKILL during data preparation and during fine-tuning, and two runs of one experiment at the same time."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from data_prep.corpus.shards import file_sha256
from pipeline.engine.dag import MARKER
from tests.helpers import ENDINGS, OBJECTS, SUBJECTS, VERBS
from tests.pipeline_cli import run_pipeline_cli, stage_executions, start_pipeline_cli, wait_for_file


def _write_big_corpus(root: Path, n_books: int = 40, book_bytes: int = 300_000) -> Path:
    """Enough text that preparing it takes long enough to be killed half-way."""
    rng = random.Random(1)
    root.mkdir(parents=True)
    for b in range(n_books):
        paragraphs, size = [], 0
        while size < book_bytes:
            paragraph = " ".join(f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                                 f"{rng.choice(ENDINGS)}." for _ in range(rng.randint(3, 6)))
            paragraphs.append(paragraph)
            size += len(paragraph) + 2
        (root / f"book_{b:02d}.txt").write_text(f"Book {b}\n\n" + "\n\n".join(paragraphs) + "\n")
    return root


def _kill_run(proc: subprocess.Popen) -> None:
    """SIGKILLs the whole process group and checks that nothing of the run survives to write afterwards."""
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    _, alive = psutil.wait_procs(family, timeout=60)
    survivors = [f"{p.pid} {p.name()}" for p in alive]
    for p in alive:
        p.kill()
    assert not survivors, f"processes of the killed run still alive: {survivors}"


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir() if p.is_file()}


def _shard_digests(prepare_dir: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(prepare_dir.glob("shard-*.arrow"))}


@pytest.mark.slow
def test_sigkill_during_prepare_then_rerun_gives_the_clean_runs_shards(tmp_path):
    corpus = _write_big_corpus(tmp_path / "big_books")
    overrides = [f"data.corpus_dir={corpus}", "data.shard_bytes=200000", "pipeline.until=prepare"]

    killed = start_pipeline_cli(tmp_path, overrides)
    first = wait_for_file(killed, tmp_path / "cache", "stages/prepare/*/shard-*")
    _kill_run(killed)
    prepare_dir = first.parent
    before = _snapshot(prepare_dir)
    time.sleep(2)
    assert _snapshot(prepare_dir) == before, "files changed after the run was killed"
    assert not (prepare_dir / MARKER).exists() and not (prepare_dir / "manifest.json").exists()
    # What a reader can see is either a complete shard (its Arrow footer is written last) or a *.tmp file.
    for path in prepare_dir.glob("shard-*"):
        if path.suffix == ".arrow":
            assert pa.ipc.open_file(pa.memory_map(str(path))).num_record_batches > 0, path
        else:
            assert path.name.endswith(".arrow.tmp"), path

    run_pipeline_cli(tmp_path, overrides)
    assert stage_executions(tmp_path / "cache", "prepare") == 2
    manifest = json.loads((prepare_dir / "manifest.json").read_text())
    listed = {shard["file"]: shard["sha256"] for shard in manifest["shards"]}
    assert _shard_digests(prepare_dir) == listed  # every shard on disk is listed, and is what the manifest says
    assert not list(prepare_dir.glob("*.tmp"))

    clean = tmp_path / "clean"
    clean.mkdir()
    run_pipeline_cli(clean, [*overrides, f"paths.cache_dir={clean / 'cache'}"])
    assert _shard_digests(clean / "run" / "prepare") == listed


@pytest.mark.slow
def test_sigkill_during_finetune_then_rerun_keeps_the_finished_models(tmp_path):
    # Six fine-tuning runs of ~30 epochs each, long enough that the kill lands after the first and before the last,
    # plus the bow_logreg and w2v_mean baselines' three files each.
    overrides = ["finetune.seeds=[1,2,3]", "finetune.epochs=30"]
    killed = start_pipeline_cli(tmp_path, overrides)
    first = wait_for_file(killed, tmp_path / "cache", "stages/finetune/*/finished/*.json")
    _kill_run(killed)
    finished_dir = first.parent
    finished_before = {p.name: p.read_bytes() for p in finished_dir.glob("*.json")}
    assert 0 < len(finished_before) < 12
    assert not (finished_dir.parent / MARKER).exists()

    result = run_pipeline_cli(tmp_path, overrides)
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_pretrain"):
        assert stage_executions(tmp_path / "cache", stage) == 1, stage  # finished stages are not run again
    for name, content in finished_before.items():
        assert f"found {name}, skipping" in result.stdout + result.stderr
        assert (finished_dir / name).read_bytes() == content
    assert len(list(finished_dir.glob("*.json"))) == 12
    rows = json.loads((tmp_path / "run" / "finetune" / "results.json").read_text())
    assert {(row["model"], row["seeds"]) for row in rows} >= {("bert", 3), ("bert_random", 3)}


@pytest.mark.slow
def test_two_concurrent_runs_share_one_preparation(tmp_path):
    runs = [start_pipeline_cli(tmp_path, ["pipeline.until=bert_examples", f"hydra.run.dir={tmp_path / name}"])
            for name in ("run1", "run2")]
    for proc in runs:
        output, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, output[-4000:]
    for stage in ("prepare", "bert_tokenizer", "bert_examples"):
        assert stage_executions(tmp_path / "cache", stage) == 1, stage  # the other run waited on the lock, then reused
    first, second = tmp_path / "run1" / "prepare", tmp_path / "run2" / "prepare"
    assert first.resolve() == second.resolve()
    assert _shard_digests(first) == _shard_digests(second) != {}
    manifest = json.loads((first / "manifest.json").read_text())
    assert _shard_digests(first) == {shard["file"]: shard["sha256"] for shard in manifest["shards"]}


# A stage attempt SIGKILLed where it trains word vectors: the scratch copy of the tokenised corpus is written by then.
_KILLED_IN_WORD2VEC = """
import os, signal, sys
from pathlib import Path

from pipeline import piece_vectors
from pipeline.downstream import word2vec
from tests.helpers import TinyRun, tiny_config


def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


word2vec.train_word2vec = piece_vectors.train_word2vec = killed
TinyRun(tiny_config(Path(sys.argv[1]), sys.argv[3:])).run_stage(sys.argv[2])
"""


@pytest.mark.parametrize("stage, overrides, outputs", [
    ("word2vec", [], {"words.txt", "vectors.npy"}),
    ("bert_piece_vectors", ["pretrain.init_embeddings=word2vec"], {"vectors.npy"}),
], ids=["word2vec", "bert_piece_vectors"])
def test_a_stage_killed_while_training_word_vectors_leaves_no_scratch_in_the_output_a_rerun_finishes(
        tmp_path, ray_session, stage, overrides, outputs):
    """The word2vec and piece-vector stages wrote their tokenised copy of the corpus to a
    temporary directory inside their output; a killed attempt left it there, and the rerun that finished the stage
    recorded it in its marker as an output."""
    from tests.helpers import TinyRun, tiny_config

    run = TinyRun(tiny_config(tmp_path, overrides))
    for upstream in run.plan.stages[stage].upstream:
        run.run_stage(upstream)
    killed = subprocess.run([sys.executable, "-c", _KILLED_IN_WORD2VEC, str(tmp_path), stage, *overrides],
                            cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert run.run_stage(stage)["state"] == "ran"
    out_dir = run.stage_dir(stage)
    expected = {*outputs, "stage.json", "stage.log"}
    assert set(json.loads((out_dir / MARKER).read_text())["outputs"]) == expected
    assert {p.name for p in out_dir.iterdir()} == {*expected, MARKER}
    assert sorted(p.name for p in out_dir.parent.iterdir() if p.name.endswith(".scratch")) == []
