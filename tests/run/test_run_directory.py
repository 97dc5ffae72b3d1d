"""A run directory given again (hydra.run.dir): what an earlier run left there is not shown as this run's."""
from __future__ import annotations

import json

from pipeline.runner import run_pipeline
from pipeline.status import read_status
from tests.helpers import tiny_config

DATA_STAGES = ["prepare", "bert_tokenizer", "bert_examples"]


def leave_an_earlier_run(tmp_path, run_dir) -> None:
    """The links and pipeline.json of a finished run of more stages, its report saying what it found."""
    run_dir.mkdir()
    stages = ["prepare", "bert_tokenizer", "bert_examples", "bert_pretrain", "finetune", "report"]
    for name in stages:
        output = tmp_path / "earlier_cache" / "stages" / name / "0123456789abcdef"
        output.mkdir(parents=True)
        (run_dir / name).symlink_to(output, target_is_directory=True)
    (run_dir / "report" / "results.md").write_text("# the earlier run's results: bert 0.9100\n")
    (run_dir / "finetune" / "results.json").write_text("[]")
    (run_dir / "pipeline.json").write_text(json.dumps({"ended": True, "stages": {
        name: {"hash": "0123456789abcdef", "output": str(run_dir / name), "state": "complete"} for name in stages}}))


def test_a_rerun_with_other_settings_shows_its_own_stages_and_the_same_command_resumes(tmp_path, ray_session,
                                                                                        capsys):
    """`pipeline.until=bert_examples data.min_tokens=4` into a finished run's directory printed that run's results.md
    as its own and kept its links to bert_pretrain, finetune and report; rerunning the same command (the documented
    resume) keeps this run's links."""
    cfg = tiny_config(tmp_path, ["pipeline.until=bert_examples", "data.min_tokens=4"])
    run_dir = tmp_path / "run"
    leave_an_earlier_run(tmp_path, run_dir)
    run_pipeline(cfg)
    out = capsys.readouterr().out
    assert "earlier run's results" not in out and "results:" not in out
    assert (f"note: hydra.run.dir={run_dir} held an earlier run's stages that this run does not have (bert_pretrain, "
            "finetune, report); their links were removed") in out
    assert sorted(p.name for p in run_dir.iterdir() if p.is_symlink()) == sorted(DATA_STAGES)
    assert all((run_dir / name).resolve().is_relative_to(tmp_path / "cache") for name in DATA_STAGES)
    assert [(s.name, s.state) for s in read_status(run_dir)] == [(name, "complete") for name in DATA_STAGES]

    run_pipeline(tiny_config(tmp_path, ["pipeline.until=bert_examples", "data.min_tokens=4"]))
    out = capsys.readouterr().out
    assert "note: hydra.run.dir" not in out
    assert [(s.name, s.state) for s in read_status(run_dir)] == [(name, "cached") for name in DATA_STAGES]
    assert sorted(p.name for p in run_dir.iterdir() if p.is_symlink()) == sorted(DATA_STAGES)
