"""Bad numbers fail before the first stage runs, naming the setting, and leave the cache as it was (issue 21, item 5):
they used to surface in pretraining, hours in, or hang."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import runner
from pipeline.engine.dag import MARKER, plan
from pipeline.runner import run_pipeline, validate
from pipeline.stages import STAGES
from tests.conftest import tiny_config


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """A run that gets as far as starting Ray has passed validation (and with ray.num_cpus=0 would hang)."""
    monkeypatch.setattr(runner, "init_ray", lambda cfg: pytest.fail("validation passed: the run started Ray"))


def _fails_before_any_stage(cfg, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        run_pipeline(cfg)
    assert not (Path(cfg.paths.cache_dir) / "stages").exists()


@pytest.mark.parametrize("override, message", [
    ("pretrain.lr=abc", r"pretrain\.lr='abc': expected a number > 0; set pretrain\.lr "),
    ("pretrain.batch_size=0", r"pretrain\.batch_size=0: expected an integer >= 1"),
    ("pretrain.max_steps=2.5", r"pretrain\.max_steps=2\.5: expected an integer >= 1"),
    ("examples.max_seq_length=-8", r"examples\.max_seq_length=-8: expected an integer >= 1"),
    ("finetune.lr=0", r"finetune\.lr=0: expected a number > 0"),
    ("pretrain.val_fraction=1.5", r"pretrain\.val_fraction=1\.5: expected a number >= 0 and <= 1"),
    ("ray.num_cpus=0", r"ray\.num_cpus=0: expected an integer >= 1"),  # hung forever, waiting for a CPU
])
def test_a_bad_number_fails_before_any_stage_naming_its_key(tmp_path, override, message):
    _fails_before_any_stage(tiny_config(tmp_path, [override]), ValueError, message)


def test_a_null_where_null_means_all_is_accepted_and_a_cluster_owns_its_cpus(tmp_path):
    validate(tiny_config(tmp_path, ["finetune.max_train_examples=null", "ray.address=auto", "ray.num_cpus=0"]))


def test_a_bad_number_with_force_keeps_the_finished_output(tmp_path):
    """`ray.num_cpus=0 pipeline.force=[prepare]` deleted the finished prepare output, then hung."""
    cfg = tiny_config(tmp_path, ["pipeline.force=[prepare]", "ray.num_cpus=0"])
    finished = plan(cfg, STAGES).dirs["prepare"]
    finished.mkdir(parents=True)
    (finished / MARKER).write_text(json.dumps({"stage": "prepare"}))
    with pytest.raises(ValueError, match="ray.num_cpus=0"):
        run_pipeline(cfg)
    assert (finished / MARKER).is_file()


@pytest.mark.parametrize("stages", ["[prepare,tokenizer,examples,pretrain]", "[finetune]"])
def test_a_sequence_longer_than_the_position_table_fails_at_start_up(tmp_path, stages):
    """Also when pretraining is in the run only as what `finetune` needs: the check used to read pipeline.stages."""
    cfg = tiny_config(tmp_path, ["model.config.position_embedding_type=learned",
                                 "model.config.max_position_embeddings=64", "examples.max_seq_length=100000",
                                 f"pipeline.stages={stages}"])
    _fails_before_any_stage(cfg, ValueError, r"examples\.max_seq_length=100000 is longer than the model's position "
                                             r"table \(model\.config\.max_position_embeddings=64\)")
