"""The probes' data is optional, as a fresh clone has no ../shared/data: a task whose data is not at its path is
skipped with a warning by the evaluate stage and by prepare's decontamination, named in the stage's summary and in
the report, and its data added later changes both stages' keys."""
from __future__ import annotations

import json

from pipeline.corpus import EvaluationSources, evaluation_texts
from pipeline.engine.dag import stage_hashes
from pipeline.evaluation.senteval import SentevalConfig, senteval_files_fingerprint
from pipeline.report.report import write_report
from pipeline.stages import STAGES
from tests.helpers import TinyRun, tiny_config, write_mr


def _probes_config(tmp_path, data_root):
    """The evaluate stage alone, on the bag of GloVe (no pretraining upstream), over the default four tasks."""
    return tiny_config(tmp_path, ["pipeline.stages=[evaluate]", "evaluate.encoders=[glove_bow]",
                                  f"senteval.data_root={data_root}", "senteval.classifier.cv_folds=3",
                                  "senteval.classifier.inner_folds=2"])


def test_without_probe_data_the_evaluate_stage_completes_and_it_and_the_report_name_the_tasks_not_run(tmp_path):
    root = tmp_path.resolve() / "probes"  # the path looked for is given resolved
    root.mkdir()
    run = TinyRun(_probes_config(tmp_path, root))
    summary = run.run_stage("evaluate")
    out = run.stage_dir("evaluate")
    assert summary["results"] == [] and json.loads((out / "results.json").read_text()) == []
    sick = f"{root}/senteval/SICK/SICK.txt"
    assert summary["tasks_without_data"] == {"MR": f"{root}/senteval/MR", "SICKEntailment": sick,
                                             "SICKRelatedness": sick, "MRPC": f"{root}/glue/MRPC"}
    assert json.loads((out / "stage.json").read_text())["tasks_without_data"] == summary["tasks_without_data"]
    log = (out / "stage.log").read_text()
    assert log.count("WARNING: senteval task ") == 4
    assert (f"WARNING: senteval task MRPC: no data at {root}/glue/MRPC, so the evaluate stage skips it. To run it, "
            "set TEXTREP_SHARED_DATA (or senteval.data_root) to a directory holding glue/MRPC; to do without it, "
            "drop it (~senteval.tasks.MRPC) or leave evaluate out of pipeline.stages") in log

    (tmp_path / "report").mkdir()
    md = write_report({"evaluate": out}, tmp_path / "report", "unit")["results_md"].read_text()
    assert (f"**Not run**: MR (no data at {root}/senteval/MR); SICKEntailment (no data at {sick}); SICKRelatedness "
            f"(no data at {sick}); MRPC (no data at {root}/glue/MRPC). To run them, set TEXTREP_SHARED_DATA") in md
    assert "No results: the stage scored nothing" in md


def test_a_task_whose_data_is_there_runs_and_the_others_are_named_as_not_run(tmp_path):
    root = tmp_path.resolve() / "probes"  # the path looked for is given resolved
    write_mr(root / "senteval" / "MR")
    summary = TinyRun(_probes_config(tmp_path, root)).run_stage("evaluate")
    assert {(row["model"], row["task"], row["metric"]) for row in summary["results"]} == {
        ("glove_bow", "MR", "accuracy")}
    assert list(summary["tasks_without_data"]) == ["SICKEntailment", "SICKRelatedness", "MRPC"]


def test_decontamination_skips_tasks_without_data_and_their_data_added_later_changes_the_keys(tmp_path, capsys):
    root = tmp_path.resolve() / "probes"  # the path looked for is given resolved
    root.mkdir()
    cfg = _probes_config(tmp_path, root)
    assert evaluation_texts(EvaluationSources.of(cfg)) == {}
    printed = capsys.readouterr().out
    assert printed.count("WARNING: senteval task ") == 4
    assert (f"WARNING: senteval task MR: no data at {root}/senteval/MR, so prepare does not decontaminate the corpus "
            "against it, and the evaluate stage will skip it. To run it, set TEXTREP_SHARED_DATA") in printed
    keys = stage_hashes(cfg, STAGES, ["prepare", "evaluate"])

    write_mr(root / "senteval" / "MR")
    texts = evaluation_texts(EvaluationSources.of(cfg))
    assert list(texts) == ["senteval MR"] and len(texts["senteval MR"]) == 2 * 10 * 3
    assert "senteval task MR:" not in capsys.readouterr().out
    added = stage_hashes(cfg, STAGES, ["prepare", "evaluate"])
    assert added["prepare"] != keys["prepare"] and added["evaluate"] != keys["evaluate"]


def test_a_task_without_data_fingerprints_as_missing_apart_from_an_empty_or_a_filled_directory(tmp_path):
    settings = SentevalConfig(data_root=str(tmp_path / "nowhere"), tasks={"MR": {"kind": "mr", "path": "MR"}})
    missing = senteval_files_fingerprint(settings, tmp_path / "cache")  # its parent is missing too: no error
    (tmp_path / "nowhere" / "MR").mkdir(parents=True)
    empty = senteval_files_fingerprint(settings, tmp_path / "cache")
    (tmp_path / "nowhere" / "MR" / "rt-polarity.pos").write_text("a fine film\n")
    filled = senteval_files_fingerprint(settings, tmp_path / "cache")
    assert len({missing, empty, filled}) == 3
