"""typed_settings: a composed block as its schema's object, with the values the command line set."""
from __future__ import annotations

from pipeline.engine.settings import typed_settings
from pipeline.evaluation.senteval import SentevalConfig
from tests.helpers import SENTEVAL_MR_ONLY, tiny_config


def test_a_map_the_run_trimmed_stays_trimmed_and_other_keys_take_the_command_lines_values(tmp_path):
    """Merged into the schema's defaults, `senteval.tasks` got back the tasks `~senteval.tasks.X` removed: the
    evaluate stage then read SICK and MRPC files the run had dropped."""
    cfg = tiny_config(tmp_path, [*SENTEVAL_MR_ONLY, "senteval.batch_size=7"])
    settings = typed_settings(cfg.senteval, SentevalConfig)
    assert isinstance(settings, SentevalConfig)
    assert list(settings.tasks) == ["MR"] and settings.tasks["MR"] == {"kind": "mr", "path": "MR"}
    assert settings.batch_size == 7 and settings.classifier.cv_folds == 3 and settings.classifier.inner_folds == 2
    assert list(typed_settings(tiny_config(tmp_path).senteval, SentevalConfig).tasks) == [
        "MR", "SICKEntailment", "SICKRelatedness", "MRPC"]
