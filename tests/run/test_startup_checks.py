"""Bad numbers and bad task files fail before the first stage runs, naming the setting or the file and line, and leave
the cache as it was (issue 21, items 5 and 7): they used to surface in pretraining or fine-tuning, hours in, or hang."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import runner
from pipeline.engine.dag import MARKER, plan
from pipeline.runner import run_pipeline, validate
from pipeline.stages import STAGES
from tests.helpers import tiny_config, write_stsb


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """A run that gets as far as starting Ray has passed validation (and with ray.num_cpus=0 would hang)."""
    monkeypatch.setattr(runner, "init_ray", lambda cfg: pytest.fail("validation passed: the run started Ray"))


def _fails_before_any_stage(cfg, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        run_pipeline(cfg)
    assert not (Path(cfg.paths.cache_dir) / "stages").exists()


@pytest.mark.parametrize("override, message", [
    ("pretrain.lr=-1", r"pretrain\.lr=-1\.0: expected a number > 0; set pretrain\.lr "),
    ("pretrain.batch_size=0", r"pretrain\.batch_size=0: expected an integer >= 1"),
    ("examples.max_seq_length=-8", r"examples\.max_seq_length=-8: expected an integer >= 5"),
    # issue 39, defects 5 and 8: these passed start-up and failed, or did nothing useful, in a stage
    ("examples.max_seq_length=2", r"examples\.max_seq_length=2: expected an integer >= 5 \(\[CLS\] a \[SEP\] b"),
    ("pretrain.val_fraction=1", r"pretrain\.val_fraction=1\.0: expected a number >= 0 and < 1 \(the held-out share"),
    ("tokenizer.vocab_size=3", r"tokenizer\.vocab_size=3: expected an integer >= 6 \(5 special tokens and at least"),
    ("gpt.vocab_size=10", r"gpt\.vocab_size=10: expected an integer >= 257 \(byte-level BPE's 256 byte pieces"),
    ("elmo.vocab_size=3", r"elmo\.vocab_size=3: expected an integer >= 4 \(its special words"),
    ("skip_thought.vocab_size=2", r"skip_thought\.vocab_size=2: expected an integer >= 4 \(its special words"),
    ("finetune.lr=0", r"finetune\.lr=0\.0: expected a number > 0"),
    ("pretrain.val_fraction=1.5", r"pretrain\.val_fraction=1\.5: expected a number >= 0 and < 1"),
    ("ray.num_cpus=0", r"ray\.num_cpus=0: expected an integer >= 1"),  # hung forever, waiting for a CPU
    ("elmo.window=0", r"elmo\.window=0: expected an integer >= 1"),  # a family's own block (ElmoConfig)
    ("gpt.block_size=0", r"gpt\.block_size=0: expected an integer >= 1"),
    ("gpt.pretrain.max_steps=0", r"gpt\.pretrain\.max_steps=0: expected an integer >= 1"),  # a family's own block
    # the range is stated once, on the schema's field, and holds in every block that has the key
    ("pretrain_phase2.lr=0", r"pretrain_phase2\.lr=0\.0: expected a number > 0"),
    ("pretrain_phase2.weight_decay=-1", r"pretrain_phase2\.weight_decay=-1\.0: expected a number >= 0"),
    ("pretrain_phase2.max_seq_length=4", r"pretrain_phase2\.max_seq_length=4: expected an integer >= 5"),
])
def test_a_bad_number_fails_before_any_stage_naming_its_key(tmp_path, override, message):
    _fails_before_any_stage(tiny_config(tmp_path, [override]), ValueError, message)


def test_tasks_are_not_a_config_group_that_an_override_could_silently_fill():
    """Issue 18: conf/task/ made `+task=cola` compose a `task:` key nothing reads; tasks are picked by finetune.task."""
    from pipeline import CONF_DIR
    from pipeline.downstream.tasks import TASK_DIR, load_task

    assert not (CONF_DIR / "task").exists() and TASK_DIR.parent == CONF_DIR.parent
    assert load_task("cola").name == "cola"


def test_a_null_where_null_means_all_is_accepted_and_a_cluster_owns_its_cpus(tmp_path):
    validate(tiny_config(tmp_path, ["finetune.max_train_examples=null", "ray.address=auto", "ray.num_cpus=0"]))


def test_a_null_in_an_override_block_keeps_the_value_it_overrides(tmp_path):
    """gpt.pretrain and pretrain_phase2 leave a key null where they keep pretrain's value, which is in range."""
    validate(tiny_config(tmp_path, ["gpt.pretrain.lr=null", "pretrain_phase2.max_steps=null",
                                    "pretrain_phase2.lr=null"]))


def test_a_bad_number_with_force_keeps_the_finished_output(tmp_path):
    """`ray.num_cpus=0 pipeline.force=[prepare]` deleted the finished prepare output, then hung."""
    cfg = tiny_config(tmp_path, ["pipeline.force=[prepare]", "ray.num_cpus=0"])
    finished = plan(cfg, STAGES).dirs["prepare"]
    finished.mkdir(parents=True)
    (finished / MARKER).write_text(json.dumps({"stage": "prepare"}))
    with pytest.raises(ValueError, match="ray.num_cpus=0"):
        run_pipeline(cfg)
    assert (finished / MARKER).is_file()


@pytest.mark.parametrize("stages", ["[prepare,bert_tokenizer,bert_examples,bert_pretrain]", "[finetune]"])
def test_a_sequence_longer_than_the_position_table_fails_at_start_up(tmp_path, stages):
    """Also when pretraining is in the run only as what `finetune` needs: the check used to read pipeline.stages."""
    cfg = tiny_config(tmp_path, ["model.config.position_embedding_type=learned",
                                 "model.config.max_position_embeddings=64", "examples.max_seq_length=100000",
                                 f"pipeline.stages={stages}"])
    _fails_before_any_stage(cfg, ValueError, r"examples\.max_seq_length=100000 is longer than the model's position "
                                             r"table \(model\.config\.max_position_embeddings=64\)")


def _break_task_file(tmp_path: Path, line: int, row: str) -> Path:
    """The tiny run's sentiment task (tests/helpers.py) with line `line` (1-based, header included) of train.tsv
    replaced by `row`."""
    tiny_config(tmp_path)  # writes the task
    train = tmp_path / "task" / "train.tsv"
    lines = train.read_text().splitlines()
    lines[line - 1] = row
    train.write_text("\n".join(lines) + "\n")
    return train


@pytest.mark.parametrize("row, message", [
    ("a dull film\tnegative", r"train\.tsv:5: unknown label 'negative'; task sst2 has labels \['0', '1'\]"),
    ("a dull film\t0\ta stray tab", r"train\.tsv:5: expected 2 tab-separated fields, as on the file's header, got 3"),
])
def test_a_bad_task_file_fails_before_any_stage_naming_file_and_line(tmp_path, row, message):
    _break_task_file(tmp_path, 5, row)
    _fails_before_any_stage(tiny_config(tmp_path), ValueError, message)


def test_a_train_split_of_one_label_fails_before_any_stage(tmp_path):
    """It failed in scikit-learn's LogisticRegressionCV (bow_logreg) after the models trained."""
    tiny_config(tmp_path)  # writes the task
    train = tmp_path / "task" / "train.tsv"
    header, *rows = train.read_text().splitlines()
    train.write_text("\n".join([header, *(f"{row[:-1]}1" for row in rows)]) + "\n")
    _fails_before_any_stage(tiny_config(tmp_path), ValueError, rf"{train}: every one of its {len(rows)} examples has "
                                                               r"label '1'; task sst2 needs at least two of its labels")


def test_a_train_size_of_one_for_a_classification_task_fails_before_any_stage(tmp_path):
    """finetune.train_sizes=[1] fine-tuned every model, then bow_logreg failed on its one-label subset
    (`This solver needs samples of at least 2 classes`)."""
    _fails_before_any_stage(tiny_config(tmp_path, ["finetune.train_sizes=[1,null]"]), ValueError,
                            r"finetune\.train_sizes=\[1, None\]: a subset of 1 example holds a single label, .* task "
                            r"sst2 needs sizes of at least 2")
    validate(tiny_config(tmp_path, ["finetune.train_sizes=[2,null]"]))


def test_a_repeated_task_fails_before_any_stage(tmp_path):
    """finetune.task=[sst2,sst2] counted each row twice: `seeds 2`, `per_seed [0.575, 0.575]`."""
    _fails_before_any_stage(tiny_config(tmp_path, ["finetune.task=[sst2,sst2]"]), ValueError,
                            r"finetune\.task=\['sst2', 'sst2'\] repeats \['sst2'\]: a repeated task's rows would be "
                            r"counted again, as if from more seeds; give each task once")


def test_a_regression_label_that_is_not_finite_fails_before_any_stage(tmp_path):
    """A `nan` score was read, and fine-tuning then failed blaming finetune.lr."""
    write_stsb(tmp_path / "stsb")
    dev = tmp_path / "stsb" / "dev.tsv"
    lines = dev.read_text().splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\tnan"
    dev.write_text("\n".join(lines) + "\n")
    cfg = tiny_config(tmp_path, ["finetune.task=stsb", f"finetune.data_dir={tmp_path / 'stsb'}"])
    _fails_before_any_stage(cfg, ValueError, rf"{dev}:3: label 'nan' is not a finite number; task stsb is a regression")


def test_task_files_are_not_read_by_a_run_without_finetune(tmp_path):
    _break_task_file(tmp_path, 5, "a dull film\tnegative")
    validate(tiny_config(tmp_path, ["pipeline.until=bert_pretrain"]))


def test_a_snapshot_past_gpts_own_steps_fails_before_any_stage(tmp_path):
    """experiment=bert_vs_gpt: pretrain.encoder_snapshots fits BERT's pretrain.max_steps, but GPT inherits it over
    its own, fewer, steps; its stage would fail after BERT's pretraining."""
    cfg = tiny_config(tmp_path, ["pretrain.encoder_snapshots=[20]", "gpt.pretrain.max_steps=10"],
                      experiment="bert_vs_gpt")
    _fails_before_any_stage(cfg, ValueError, r"gpt\.pretrain\.encoder_snapshots=\[20\]: \[20\] not a step of the run; "
                                             r"each must be a whole number from 1 to gpt\.pretrain\.max_steps=10")


def test_an_until_outside_the_runs_stages_is_warned_about(tmp_path, capsys):
    """Issue 39, defect 8: `+experiment=gpt_tiny pipeline.until=bert_pretrain` (BERT's stage) ran, without a word, only
    what the two share."""
    validate(tiny_config(tmp_path, ["pipeline.until=bert_pretrain"], experiment="gpt_tiny"))
    out = capsys.readouterr().out
    assert "WARNING: pipeline.until=bert_pretrain is not one of this run's stages (prepare, gpt_tokenizer" in out
    assert ("the run stops at what it shares with bert_pretrain: prepare. did you mean pipeline.until=gpt_pretrain?"
            in out)
    validate(tiny_config(tmp_path, ["pipeline.until=gpt_pretrain"], experiment="gpt_tiny"))
    assert "WARNING" not in capsys.readouterr().out


def test_a_cache_dir_that_is_a_file_is_called_a_file(tmp_path):
    """`paths.cache_dir=FILE` (also with pipeline.dry_run=true) failed with a traceback from
    making the directory, FileExistsError, naming no setting."""
    cfg = tiny_config(tmp_path)
    (tmp_path / "cache_file").write_text("not a directory")
    cfg.paths.cache_dir = str(tmp_path / "cache_file")
    cfg.pipeline.dry_run = True
    with pytest.raises(NotADirectoryError, match=rf"paths.cache_dir={tmp_path / 'cache_file'} is a file, not a "
                                                 r"directory; set paths.cache_dir to a directory"):
        run_pipeline(cfg)


def test_a_task_data_dir_that_is_a_file_is_called_a_file(tmp_path):
    """Issue 39, defect 8: a finetune.data_dir naming the train file itself was reported as "does not exist"."""
    cfg = tiny_config(tmp_path)
    train = tmp_path / "task" / "train.tsv"
    cfg.finetune.data_dir = str(train)
    _fails_before_any_stage(cfg, NotADirectoryError, rf"finetune.data_dir={train} is a file, not a directory; pass "
                                                     rf"the directory that holds .*finetune.data_dir={train.parent}\)")


def test_fp16_autocast_on_the_cpu_fails_at_start_up_instead_of_turning_into_bf16(tmp_path):
    """Lightning replaced trainer.precision=16-mixed on the CPU by bf16-mixed, with a warning in a stage's log."""
    _fails_before_any_stage(tiny_config(tmp_path, ["trainer.precision=16-mixed"]), ValueError,
                            r"^trainer\.precision=16-mixed: fp16 autocast needs a CUDA GPU, and on the CPU Lightning "
                            r"trains in bf16-mixed in its place; set trainer\.precision=bf16-mixed, 32-true or auto$")
