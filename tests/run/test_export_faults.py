"""`python -m pipeline.export` given damaged stage files, a full disk, a bad --to, or what a killed export left: it
refuses with one line (exit 2) and leaves nothing half-written under --to.

One tiny BERT run to its pretraining stage, made once; each test works on a copy of it (cache and run directory)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.export import main as export_main
from tests.helpers import tiny_config
from tests.hf_checks import STEPS, write_run_directory

RUN_OVERRIDES = [*STEPS, "pipeline.until=bert_pretrain"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, ray_session) -> Path:
    """A directory holding `cache/` and `run/`: bert_tiny's run through bert_pretrain."""
    root = tmp_path_factory.mktemp("export_faults")
    write_run_directory(tiny_config(root, RUN_OVERRIDES), root / "run", ["+experiment=bert_tiny", *RUN_OVERRIDES])
    return root


@pytest.fixture
def run_dir(finished_run, tmp_path) -> Path:
    """A copy of the finished run, its links and pipeline.json pointing into the copy's cache."""
    root = tmp_path / "copy"
    shutil.copytree(finished_run, root, symlinks=True)
    run = root / "run"
    pipeline_file = run / "pipeline.json"
    pipeline_file.write_text(pipeline_file.read_text().replace(str(finished_run), str(root)))
    for link in (p for p in run.iterdir() if p.is_symlink()):
        target = str(link.readlink()).replace(str(finished_run), str(root))
        link.unlink()
        link.symlink_to(target, target_is_directory=True)
    return run


def hf_dir(run_dir: Path) -> Path:
    return run_dir / "bert_pretrain" / "hf"


def test_export_refuses_a_model_whose_code_or_vocabulary_differ_from_what_its_stage_wrote(run_dir, tmp_path, capsys):
    """Two vocabulary lines swapped (the same size) and a line appended to the modelling code, which the card tells
    users to run with trust_remote_code=True: `pipeline.status --verify` flags both, and export shipped both, exit 0."""
    vocab = hf_dir(run_dir) / "vocab.txt"
    lines = vocab.read_text().splitlines(keepends=True)
    lines[10], lines[11] = lines[11], lines[10]
    vocab.write_text("".join(lines))
    with open(hf_dir(run_dir) / "modeling_textrep_bert.py", "a") as code:
        code.write("import os; os.system('echo owned')\n")
    to = tmp_path / "exported"
    assert export_main([str(run_dir), "--to", str(to)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    source = hf_dir(run_dir).resolve()
    assert f"error: nothing was exported: the finished output of stage bert_pretrain in {source} is not" in err
    assert "vocab.txt has other contents than the stage wrote" in err
    assert "modeling_textrep_bert.py has " in err and "pipeline.force=[bert_pretrain]" in err
    assert not to.exists()


def test_export_refuses_a_file_added_to_the_models_directory(run_dir, tmp_path, capsys):
    (hf_dir(run_dir) / "extra.py").write_text("print('not the stage's')\n")
    assert export_main([str(run_dir), "--to", str(tmp_path / "exported")]) == 2
    assert "extra.py was not written by the stage (added after it finished)" in capsys.readouterr().err
    assert not (tmp_path / "exported").exists()


def test_export_onto_a_full_disk_names_the_volume_and_leaves_no_file(run_dir, tmp_path, monkeypatch, capsys):
    """A copy that runs out of space on its third file: shutil.Error's traceback and exit 1 before, with the files
    copied so far and a zero-byte one left under --to."""
    copied, copyfile = [], shutil.copyfile

    def fills_the_disk(src, dst, *args, **kwargs):
        if len(copied) == 2:
            Path(dst).write_bytes(b"")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        copied.append(src)
        return copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", fills_the_disk)
    to = tmp_path / "exported"
    to.mkdir()
    (to / "notes.txt").write_text("the user's own file, kept\n")
    assert export_main([str(run_dir), "--to", str(to)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: no space left on device writing the export to --to={to}: the volume holding it "
                          "has ")
    assert " free and the models need " in err and err.endswith("; nothing was exported\n")
    assert sorted(p.name for p in to.rglob("*")) == ["notes.txt"]


def test_export_into_a_file_says_it_is_a_file(run_dir, tmp_path, capsys):
    to = tmp_path / "a_file"
    to.write_text("not a directory\n")
    assert export_main([str(run_dir), "--to", str(to)]) == 2
    assert capsys.readouterr().err == (f"error: --to={to} is a file; pass a directory to write one subfolder per model "
                                       "into\n")
    assert to.read_text() == "not a directory\n"


def test_a_rerun_after_a_killed_export_exports_and_removes_what_the_killed_one_left(run_dir, tmp_path):
    """SIGKILL mid-copy leaves the model's staging folder; nothing under the model's own name, so the rerun needs no
    --overwrite, and it removes the staging folder of the dead export (of this host)."""
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    to = tmp_path / "exported"
    left = to / f".bert.partial.{killed.pid}@{os.uname().nodename}"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"")
    assert export_main([str(run_dir), "--to", str(to)]) == 0
    assert sorted(p.name for p in to.iterdir()) == ["bert"]
    assert json.loads((to / "bert" / "config.json").read_text())["model_type"]


def test_an_export_that_finds_its_model_exported_meanwhile_keeps_that_one(run_dir, tmp_path, monkeypatch, capsys):
    """Two exports of a run into one --to at once: the one that finishes second found no `bert` when it started, and
    copytree's FileExistsError was its traceback; now it refuses as for a `bert` that was there, leaving the other's."""
    import pipeline.export

    to, copy_verified = tmp_path / "exported", pipeline.export.copy_verified

    def the_other_export_finishes_first(model, recorded, staging):
        copy_verified(model, recorded, staging)
        (to / model.name).mkdir()
        (to / model.name / "config.json").write_text("{}")

    monkeypatch.setattr(pipeline.export, "copy_verified", the_other_export_finishes_first)
    assert export_main([str(run_dir), "--to", str(to)]) == 2
    assert capsys.readouterr().err == f"error: {to / 'bert'} exists; remove it, export elsewhere, or pass --overwrite\n"
    assert sorted(p.name for p in to.rglob("*")) == ["bert", "config.json"]


def test_export_of_a_run_whose_model_was_deleted_from_the_cache_says_so(run_dir, tmp_path, capsys):
    """It said the run 'has no finished pretraining stage to export' (pipeline.status: 'not run', exit 0); with
    BERT's phase 2 deleted it would have exported phase 1 as the final model."""
    output = (run_dir / "bert_pretrain").resolve()
    shutil.rmtree(output)
    assert export_main([str(run_dir), "--to", str(tmp_path / "exported")]) == 2
    assert capsys.readouterr().err == (
        f"error: the output of stage bert_pretrain ({output}) is gone from the cache since the run finished it; rerun "
        "the run's command to make it again (finished stages are reused), then export\n")


@pytest.mark.parametrize("config, message", [("a: [\n", "cannot be read as YAML (while parsing a flow node"),
                                             ("", "is not a run's config (it has no pipeline settings)"),
                                             ("- a list\n", "is not a run's config (it has no pipeline settings)")],
                         ids=["not-yaml", "empty", "a-list"])
def test_export_of_a_run_whose_config_is_damaged_says_so(run_dir, tmp_path, capsys, config, message):
    """A YAML error's traceback before (or, for an empty file, omegaconf's missing key)."""
    (run_dir / ".hydra" / "config.yaml").write_text(config)
    assert export_main([str(run_dir), "--to", str(tmp_path / "exported")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir / '.hydra' / 'config.yaml'} {message}") and len(err.splitlines()) == 1
    assert err.endswith("; rerun the run's command (finished stages are reused) and export the run directory it "
                        "prints\n")


def test_overwrite_replaces_a_file_in_the_models_place(run_dir, tmp_path):
    """shutil.rmtree's NotADirectoryError traceback before."""
    to = tmp_path / "exported"
    to.mkdir()
    (to / "bert").write_text("a file where the model goes\n")
    assert export_main([str(run_dir), "--to", str(to), "--overwrite"]) == 0
    assert (to / "bert" / "config.json").is_file() and (to / "bert" / "README.md").is_file()


def test_export_into_a_stages_output_is_refused(run_dir, capsys):
    """--to under a stage link of the run: the export was written into the cache, where the stage's files are checked
    on every reuse, so the next run refused the cached stage ('added after it finished') until it was rebuilt."""
    to = run_dir / "bert_pretrain" / "hf" / "exported"
    output = (run_dir / "bert_pretrain").resolve()
    assert export_main([str(run_dir), "--to", str(to)]) == 2
    assert capsys.readouterr().err == (f"error: --to={to} is inside the output of stage bert_pretrain ({output}), "
                                       "which must stay as the stage wrote it; pass a --to outside the cache\n")
    assert not to.exists()


def test_ctrl_c_during_an_export_is_one_line_and_leaves_nothing(run_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C mid-copy: a KeyboardInterrupt traceback, and the model's folder left half-copied, without its card."""
    copied, copyfile = [], shutil.copyfile

    def interrupted(src, dst, *args, **kwargs):
        if len(copied) == 2:
            raise KeyboardInterrupt
        copied.append(src)
        return copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", interrupted)
    assert export_main([str(run_dir), "--to", str(tmp_path / "exported")]) == 130
    assert capsys.readouterr().err == "interrupted; nothing was exported; rerun the same command\n"
    assert not (tmp_path / "exported").exists()
