"""What a stage read is what its cache key says, and a damaged cache entry is named, never served (issue 39, defects 1
and 2): input files are digested again before a stage starts and after it ends, and a finished stage's files are
checked against what its marker records before they are used again."""
from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline import status
from pipeline.engine import fingerprints
from pipeline.engine.dag import MARKER, Stage, StageFailed, execute_stage, plan, run_dag
from pipeline.engine.fingerprints import files_fingerprint
from pipeline.stages import STAGES
from tests.helpers import TinyRun, tiny_config, write_books, write_sentiment_task


def _three_books(tmp_path: Path, extra: list[str] | None = None):
    """bert_tiny planned up to `prepare` on a corpus of three books."""
    write_books(tmp_path / "books", n_books=3)
    write_sentiment_task(tmp_path / "task")
    return tiny_config(tmp_path, ["pipeline.until=prepare", *(extra or [])])


def test_a_book_overwritten_after_planning_is_refused_and_never_cached_under_the_old_key(tmp_path, ray_session):
    """Defect 1a: the book was overwritten once `pipeline.json` appeared; `prepare` used to finish under the key of the
    corpus as planned, so with the book restored the next run said `stage prepare: cached` and served the other
    book's text (two books kept, one 'duplicate')."""
    cfg = _three_books(tmp_path)
    run = TinyRun(cfg)
    book = tmp_path / "books" / "book_01.txt"
    original = book.read_text()
    book.write_text((tmp_path / "books" / "book_02.txt").read_text())
    with pytest.raises(StageFailed, match=r"input files changed since the run was planned: \S*book_01.txt "
                                          r"\(contents changed\).*rerun the same command"):
        run.run_stage("prepare")
    assert not (run.stage_dir("prepare") / MARKER).exists()
    book.write_text(original)
    again = TinyRun(cfg)
    assert again.stage_dir("prepare") == run.stage_dir("prepare")  # the key of the restored corpus
    assert again.run_stage("prepare")["state"] == "ran"
    manifest = json.loads((again.stage_dir("prepare") / "manifest.json").read_text())
    assert manifest["totals"]["files_kept"] == 3 and manifest["totals"]["files_duplicate"] == 0


def test_a_book_moved_away_mid_run_is_refused(tmp_path, ray_session):
    """Defect 1b: a book moved away after planning gave a manifest of '2 of 2 files' under the key of three books."""
    cfg = _three_books(tmp_path)
    run = TinyRun(cfg)
    shutil.move(tmp_path / "books" / "book_00.txt", tmp_path / "book_00.txt")
    with pytest.raises(StageFailed, match=r"\S*book_00.txt \(removed\)"):
        run.run_stage("prepare")
    assert not (run.stage_dir("prepare") / MARKER).exists()


def read_and_meddle(ctx) -> dict:
    """A stage that reads its input file, which is then rewritten (the user, or another job) before it finishes."""
    source = Path(ctx.cfg.input_dir) / "input.txt"
    (ctx.out_dir / "copy.txt").write_text(source.read_text())
    source.write_text(ctx.cfg.rewrite_to)
    return {}


def _reader_cfg(tmp_path: Path, rewrite_to: str):
    return OmegaConf.create({"input_dir": str(tmp_path / "inputs"), "rewrite_to": rewrite_to,
                             "logger": {"_target_": "lightning.pytorch.loggers.CSVLogger"},
                             "paths": {"cache_dir": str(tmp_path / "cache")},
                             "pipeline": {"stages": ["reader"], "until": None, "force": [], "dry_run": False}})


READER = {"reader": Stage("reader", read_and_meddle, (), ("input_dir",),
                          fingerprint=lambda cfg: files_fingerprint(Path(cfg.input_dir), "*", cfg.paths.cache_dir))}


def test_an_input_changed_while_the_stage_runs_leaves_nothing_a_rerun_could_resume(tmp_path):
    """Defects 1 and 1c (a fine-tuning file whose labels were flipped while pretraining ran): the digests are taken
    again once the stage has finished; a stage whose inputs changed is refused and keeps only its log, so that a rerun
    under the key of the restored file cannot reuse what was made from the other one."""
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "input.txt").write_text("the labels as they should be")
    cfg = _reader_cfg(tmp_path, rewrite_to="flipped labels")
    the_plan = plan(cfg, READER)
    out_dir = the_plan.dirs["reader"]
    with pytest.raises(StageFailed, match=r"input files changed while the stage ran: \S*input.txt \(contents "
                                          r"changed\)"):
        execute_stage(READER, cfg, "reader", the_plan.hashes["reader"], out_dir, {}, None,
                      planned_inputs=the_plan.input_files["reader"])
    assert sorted(p.name for p in out_dir.iterdir()) == ["stage.log"]
    assert "InputsChanged" in (out_dir / "stage.log").read_text()


def test_finetunes_key_covers_the_task_files_and_a_flipped_label_is_named(tmp_path):
    """Defect 1c: the task files the finetune stage reads are among the input files its plan digested, so flipping
    their labels after planning is caught (as the engine checks before and after the stage)."""
    from pipeline.engine.integrity import InputsChanged, check_inputs_unchanged

    cfg = tiny_config(tmp_path)
    the_plan = plan(cfg, STAGES)
    train = tmp_path / "task" / "train.tsv"
    assert str(train) in the_plan.input_files["finetune"].files
    check_inputs_unchanged(STAGES["finetune"].fingerprint, cfg, the_plan.input_files["finetune"], "now")
    rows = train.read_text().splitlines()
    flipped = [rows[0], *(f"{text}\t{1 - int(label)}" for text, label in (r.rsplit("\t", 1) for r in rows[1:]))]
    train.write_text("\n".join(flipped) + "\n")
    with pytest.raises(InputsChanged, match=rf"{train} \(contents changed\)"):
        check_inputs_unchanged(STAGES["finetune"].fingerprint, cfg, the_plan.input_files["finetune"], "now")


@pytest.fixture
def prepared(tmp_path, ray_session):
    """A finished `prepare` of the tiny corpus, planned up to the tokenizer that reads it."""
    run = TinyRun(tiny_config(tmp_path, ["pipeline.until=bert_tokenizer"]))
    run.run_stage("prepare")
    return run


def _shards(run: TinyRun) -> list[Path]:
    return sorted(run.stage_dir("prepare").glob("shard-*.arrow"))


def _same_length_edit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(b"the old man") if b"the old man" in data else data.index(b"the ")
    data[at:at + 3] = b"THE"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, says", [
    (lambda run: _shards(run)[1].unlink(), r"shard-00001.arrow is missing \(it had \d+ bytes\)"),
    (lambda run: _same_length_edit(_shards(run)[0]), r"shard-00000.arrow has other contents than the stage wrote"),
    (lambda run: shutil.copy(_shards(run)[0], run.stage_dir("prepare") / "shard-00099.arrow"),
     r"shard-00099.arrow was not written by the stage"),
    (lambda run: (run.stage_dir("prepare") / "stage.json").write_text('{"stage": "prep'),
     r"stage.json has \d+ bytes where the stage wrote \d+"),
], ids=["deleted", "edited-same-size", "added", "truncated"])
def test_a_damaged_finished_output_is_named_before_a_later_stage_reads_it(prepared, damage, says):
    """Defect 2: a deleted examples file trained on 188 of 401 instances with exit 0, and a shard whose bytes changed
    put a changed word into the tokenizer, though the manifest held the shard's sha256."""
    damage(prepared)
    with pytest.raises(StageFailed, match=rf"stage bert_tokenizer failed: StageFailed: the finished output of stage "
                                          rf"prepare in \S+ is not what the stage wrote: {says}.*Rerun with "
                                          rf"pipeline.force=\[prepare\] to rebuild it"):
        prepared.run_stage("bert_tokenizer")
    assert not (prepared.stage_dir("bert_tokenizer") / MARKER).exists()


def test_a_copied_cache_is_intact_and_hashed_once(prepared, tmp_path, monkeypatch):
    """Every file of a copied cache has another stat identity than the one recorded: its contents are hashed, found
    equal and memoised beside the output, so the next check is stat calls only."""
    monkeypatch.setattr(fingerprints, "SETTLE_NS", 0)  # the copies are memoised at once, not two seconds on
    shutil.copytree(tmp_path / "cache", tmp_path / "copied_cache")
    run = TinyRun(tiny_config(tmp_path, ["pipeline.until=bert_tokenizer",
                                         f"paths.cache_dir={tmp_path / 'copied_cache'}"]))
    assert run.run_stage("bert_tokenizer")["state"] == "ran"
    memo = run.stage_dir("prepare").parent / f"{run.stage_dir('prepare').name}.digests.json"
    assert len(json.loads(memo.read_text())) == len(list(run.stage_dir("prepare").iterdir())) - 1  # all but the marker


def copy_input(ctx) -> dict:
    (ctx.out_dir / "copy.txt").write_text((Path(ctx.cfg.input_dir) / "input.txt").read_text())
    return {}


COPIER = {"copier": Stage("copier", copy_input, (), ("input_dir",),
                          fingerprint=lambda cfg: files_fingerprint(Path(cfg.input_dir), "*", cfg.paths.cache_dir))}


def test_a_read_only_cache_serves_a_run_whose_stages_are_all_cached(tmp_path, monkeypatch):
    """A cache copied onto read-only storage (every output's stat identity new, the input files
    now settled) failed a run with nothing to do with a traceback, `[Errno 30] Read-only file system`, from the
    digest memo writes. Tests run as root, for whom chmod does not stop a write: the memo's writer raises EROFS."""
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "input.txt").write_text("a book")
    cfg = OmegaConf.merge(_reader_cfg(tmp_path, rewrite_to=""), {"pipeline": {"stages": ["copier"]}})
    first = plan(cfg, COPIER)
    execute_stage(COPIER, cfg, "copier", first.hashes["copier"], first.dirs["copier"], {}, None)
    shutil.copytree(tmp_path / "cache", tmp_path / "read_only_cache")
    cfg.paths.cache_dir = str(tmp_path / "read_only_cache")
    monkeypatch.setattr(fingerprints, "SETTLE_NS", 0)  # the input file is old enough to be memoised

    def read_only(path, obj):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    monkeypatch.setattr(fingerprints, "write_json_atomically", read_only)
    assert plan(cfg, COPIER).cached["copier"]
    assert run_dag(cfg, COPIER, tmp_path / "run")["copier"]["state"] == "cached"


def produce(ctx) -> dict:
    (ctx.out_dir / "value.txt").write_text("42")
    return {}


def consume(ctx) -> dict:
    return {"value": int((ctx.stage_dir("produce") / "value.txt").read_text())}


CHAIN = {s.name: s for s in [Stage("produce", produce), Stage("consume", consume, ("produce",))]}


def _chain_cfg(tmp_path: Path, **pipeline):
    return OmegaConf.create({"logger": {"_target_": "lightning.pytorch.loggers.CSVLogger"},
                             "paths": {"cache_dir": str(tmp_path / "cache")},
                             "pipeline": {"stages": ["consume"], "until": None, "force": [], "dry_run": False,
                                          **pipeline}})


def _rot(out_dir: Path, name: str, text: str) -> None:
    """Contents changed behind the stat identity's back (bit rot, or an edit within one tick of the clock): the file
    is rewritten, and the marker made to record its new identity."""
    from pipeline.engine.integrity import OUTPUTS_KEY, output_identity

    (out_dir / name).write_text(text)
    marker = json.loads((out_dir / MARKER).read_text())
    marker[OUTPUTS_KEY][name]["stat"] = output_identity((out_dir / name).stat())
    (out_dir / MARKER).write_text(json.dumps(marker))


def test_a_damaged_cached_stage_fails_the_run_before_any_work_with_the_force_that_rebuilds_it(tmp_path, ray_session):
    run_dag(_chain_cfg(tmp_path), CHAIN, tmp_path / "run1")
    produced = plan(_chain_cfg(tmp_path), CHAIN).dirs["produce"]
    (produced / "value.txt").write_text("13")
    with pytest.raises(StageFailed, match=r"stage produce in \S+ is not what the stage wrote: value.txt has other "
                                          r"contents than the stage wrote.*pipeline.force=\[produce\]"):
        run_dag(_chain_cfg(tmp_path), CHAIN, tmp_path / "run2")
    assert not (tmp_path / "run2").exists()  # before any work: not even the run directory
    results = run_dag(_chain_cfg(tmp_path, force=["produce"]), CHAIN, tmp_path / "run3")
    assert results["consume"]["value"] == 42


def test_verify_hashes_every_file_and_status_verify_lists_each_mismatch(tmp_path, ray_session, capsys):
    """pipeline.verify=true and `python -m pipeline.status --verify RUN_DIR` hash every cached file again, so they find
    what the stat check cannot: contents changed under the recorded identity."""
    run_dag(_chain_cfg(tmp_path), CHAIN, tmp_path / "run1")
    assert status.main([str(tmp_path / "run1"), "--verify"]) == 0
    assert "verified: the files of all 2 finished stages are what their stages wrote" in capsys.readouterr().out
    the_plan = plan(_chain_cfg(tmp_path), CHAIN)
    _rot(the_plan.dirs["produce"], "value.txt", "13")
    assert {r["state"] for r in run_dag(_chain_cfg(tmp_path), CHAIN, tmp_path / "run2").values()} == {"cached"}
    with pytest.raises(StageFailed, match=r"value.txt has other contents than the stage wrote"):
        run_dag(_chain_cfg(tmp_path, verify=True), CHAIN, tmp_path / "run3")
    (the_plan.dirs["consume"] / "stage.json").unlink()
    capsys.readouterr()
    assert status.main([str(tmp_path / "run1"), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "damaged: the finished output of stage produce" in out and "value.txt has other contents" in out
    assert "damaged: the finished output of stage consume" in out and "stage.json is missing" in out
