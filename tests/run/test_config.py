"""Every experiment composes to what its file states; a misspelled or bad setting fails before any work starts,
naming the key; the command line tells the user what exists when a name is wrong."""
from __future__ import annotations

import dataclasses
import enum
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import MISSING, OmegaConf

from pipeline import CONF_DIR
from pipeline.config import Config
from pipeline.downstream.finetune import task_names
from pipeline.downstream.tasks import load_task
from pipeline.runner import validate
from tests.helpers import write_books

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _leaves(node: dict, prefix: str = ""):
    """(dotted key, value) of every non-mapping value; lists are values."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_to_what_its_file_states(name, tmp_path):
    cfg = _compose([f"+experiment={name}", f"paths.run_dir={tmp_path}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    assert resolved["experiment_name"] == name
    stated = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml"), resolve=False)
    defaults = stated.pop("defaults", [])
    # `- skip_thought_small`: another experiment (`- _self_` only orders the file's own settings)
    extended = [item for item in defaults if isinstance(item, str) and item != "_self_"]
    # `- override /model: bert_base` replaces a group's option; `- /model@gpt.model: gpt_tiny` adds one at a key
    entries = [(entry, option) for item in defaults if isinstance(item, dict) for entry, option in item.items()]
    # `+experiment=[bert_tiny,zh]`: Hydra selects several options of a group from a list, in order
    base = _compose([*([f"+experiment=[{','.join(extended)}]"] if extended else []),
                     *(f"{'' if entry.startswith('override ') else '+'}{entry.split()[-1].lstrip('/')}={option}"
                       for entry, option in entries)])
    defined = dict(_leaves(OmegaConf.to_container(base, resolve=False)))
    misspelled = [key for key, _ in _leaves(stated) if key not in defined]
    assert not misspelled, (f"{name} sets {misspelled}, which the base config does not define, so nothing reads "
                            "them: fix the spelling, or add the key with its default to its schema "
                            "(pipeline/schema.py, pipeline/config.py or its family's block)")
    # a file that is not `@package _global_`, or a setting a later default overrides, would differ here
    composed = dict(_leaves(OmegaConf.to_container(cfg, resolve=False)))
    assert {key: composed.get(key, "<missing>") for key, _ in _leaves(stated)} == dict(_leaves(stated))
    for entry, _ in entries:  # the option as the base config composes it, with the file's own edits on top
        key = entry.split()[-1].lstrip("/").split("@")[-1]  # the group's key, or the one the entry puts it at
        expected = OmegaConf.merge(OmegaConf.select(base, key), OmegaConf.select(OmegaConf.create(stated), key) or {})
        assert OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=False) == \
            OmegaConf.to_container(expected, resolve=False)
    assert cfg.model._target_.startswith("models.")
    # A fresh clone has no ../shared (the data beside the team's checkout; tests/conftest.py hides it): validate reads
    # the corpus directory and the task files, so the ones an experiment names there are written small here.
    if cfg.data.corpus_dir:
        cfg.data.corpus_dir = str(write_books(tmp_path / "books", n_books=2))
    if cfg.finetune.data_dir:  # e.g. GLUE
        cfg.finetune.data_dir = str(_write_task_files(tmp_path / "tasks", task_names(cfg.finetune.task)))
    validate(cfg)


def _declared_defaults(schema: type, prefix: str = ""):
    """(dotted key, default) of every field of `schema` and its nested blocks that declares a default (not MISSING):
    the family blocks' dataclasses, pipeline/bert/settings.py's PHASE_2_DEFAULTS, GPT's own pretrain block."""
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            yield from _declared_defaults(type(value), f"{prefix}{f.name}.")
        elif not (isinstance(value, str) and value == MISSING):
            yield f"{prefix}{f.name}", _plain(value)


def _plain(value):
    """Enum members as their names, as OmegaConf's to_container(enum_to_str=True) gives them."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.value if isinstance(value, enum.Enum) else value


def _schema_yaml_disagreements(overrides: list[str]) -> list[str]:
    composed = OmegaConf.to_container(_compose(overrides), resolve=False, enum_to_str=True)
    found = []
    for key, default in _declared_defaults(Config):
        value = composed
        for part in key.split("."):
            value = value[part]
        if value != default:
            found.append(f"{key}: schema {default!r}, YAML {value!r}")
    return found


def test_no_schema_default_disagrees_with_a_yaml_default():
    """A key has one default: where a schema declares one and a YAML file of the default config (conf/config.yaml and
    the groups it picks) also sets the key, the two are the same value. Experiments may change any of them."""
    assert sum(1 for _ in _declared_defaults(Config)) > 150  # every block's, but for the config groups' options
    assert _schema_yaml_disagreements([]) == []
    # a YAML default that differs from its schema's is what this finds
    assert _schema_yaml_disagreements(["tokenizer.vocab_size=30000", "pretrain_phase2.max_steps=7"]) == [
        "tokenizer.vocab_size: schema 8000, YAML 30000", "pretrain_phase2.max_steps: schema 100, YAML 7"]


def test_root_config_only_picks_options():
    """A setting's default has one home, its schema: conf/config.yaml picks the config groups' options and Hydra's
    output directories, and sets no setting itself (a value there would shadow the schema's default and its comment)."""
    root = OmegaConf.load(CONF_DIR / "config.yaml")
    assert set(root) == {"defaults", "hydra"}, f"conf/config.yaml sets {sorted(set(root) - {'defaults', 'hydra'})}"


def _write_task_files(root: Path, names: list[str]) -> Path:
    """A two-example train and dev split of each TSV task (two labels: start-up refuses a train split of one), laid out
    as its YAML in tasks/ describes."""
    for name in names:
        task = load_task(name)
        columns = [c for c in (task.text_a, task.text_b, task.label) if c is not None]
        labels = [str(label) for label in task.labels[:2]] if task.labels is not None else ["0.5", "1.5"]
        if task.get("header", True):
            rows = [columns, *([label if c == task.label else "some words" for c in columns] for label in labels)]
        else:
            rows = [[label if i == task.label else "some words" for i in range(max(columns) + 1)] for label in labels]
        directory = root / task.data_subdir
        directory.mkdir(parents=True)
        for split in (task.train_file, task.dev_file):
            (directory / split).write_text("".join("\t".join(row) + "\n" for row in rows))
    return root


@pytest.mark.parametrize("override, message", [
    ("pretrain.lr=abc", "could not be converted to Float\n    full_key: pretrain.lr"),
    ("pretrain.max_steps=2.5", "could not be converted to Integer\n    full_key: pretrain.max_steps"),
    ("pretrain.optimizer=adam", "expected one of [adamw, lamb]\n    full_key: pretrain.optimizer"),
    ("pretrain.lr_decay=step", "expected one of [linear, cosine, noam]\n    full_key: pretrain.lr_decay"),
    ("pretrain_phase2.optimizer=adam", "full_key: pretrain_phase2.optimizer"),  # BERT's block (Family.config)
    ("finetune.models=[bert,bert_large]", "Invalid value 'bert_large'"),   # the families' model kinds
    ("evaluate.encoders=[bert_cls,no_such_encoder]", "full_key: evaluate.encoders[1]"),
    ("pipeline.stages=[prepare,pretrian]", "Invalid value 'pretrian', expected one of [prepare, bert_tokenizer"),
    ("trainer.precision=16", "full_key: trainer.precision"),
    ("trainer.strategy=fsdp", "expected one of [auto, ddp, deepspeed]"),
    ("data.input_format=xml", "full_key: data.input_format"),
    ("elmo.window=long", "full_key: elmo.window"),                               # a family's own block
    ("gpt.pretrain.lr=abc", "full_key: gpt.pretrain.lr"),                        # GPT's keys over pretrain's
    ("gpt.pretrain.max_step=50", "Key 'max_step' not in 'GptPretrainConfig'"),
    ("pretrain.encoder_snapshots=10", "full_key: pretrain.encoder_snapshots"),   # a list
    ("pretrain.lrr=1e-3", "Key 'lrr' not in 'PretrainBlock'"),                  # a misspelled key
    ("trainer=ddp", "ddp_cpu"),                                                  # an unknown option lists the rest
    ("task=cola", "Key 'task' not in 'Config'"),                                 # tasks are not a config group
    ("pretrain.masking=spans", "expected one of [token, whole_word, span]\n    full_key: pretrain.masking"),
    ("finetune.freeze_embeddings=rare", "expected one of [all, with_vector, none]\n    full_key: "
                                        "finetune.freeze_embeddings"),
    # a stale boolean (an experiment file's `freeze_embeddings: true`) names the values
    ("pretrain.freeze_embeddings=true", "expected one of [all, with_vector, none]\n    full_key: "
                                        "pretrain.freeze_embeddings"),
])
def test_a_bad_value_fails_at_composition_with_hydras_message_naming_the_key(override, message):
    with pytest.raises(ConfigCompositionException) as failure:
        _compose(["+experiment=bert_tiny", override])
    assert message in f"{failure.value}\n{failure.value.__cause__}"


@pytest.mark.parametrize("override, message", [
    ("+task=cola", "task is not a setting"),  # Hydra adds a key unchecked; nothing would read it
    ("+pretrain.lrr=1e-3", "did you mean pretrain.lr"),
    ("++pretrain_phase2.foo=1", "pretrain_phase2.foo is not a setting"),
    ("++gpt.pretrain.max_step=50", "did you mean gpt.pretrain.max_steps"),
    ("+model.config.hiden_size=64", "did you mean model.config.hidden_size"),
    ("data.corpus_dir=/no/such/dir", "data.corpus_dir"),
    ("+logger.entitty=team", "did you mean logger.entity"),     # neither WandbLogger's nor wandb.init's
    ("+trainer.fast_dev_runn=true", "did you mean trainer.fast_dev_run"),
    ("+trainer.max_steps=5", "set pretrain.max_steps"),     # the pipeline's own Trainer argument
    ("+callbacks.early_stop={_target_: lightning.pytorch.callbacks.EarlyStopping, monitr: val/loss}",
     "callbacks.early_stop.monitr"),
    ("ckpt_path=/no/such.ckpt", "ckpt_path"),
    ("finetune.task=nope", "rotten_tomatoes"),
    ("finetune.train_sizes=[100,0]", "finetune.train_sizes"),
    ("distributed.num_workers=0", "distributed.num_workers"),
    ("trainer=gpu", "no CUDA GPU") if not torch.cuda.is_available() else ("trainer.devices=2", "trainer.devices"),
])
def test_a_bad_setting_fails_before_any_work_naming_the_key(override, message, tmp_path):
    with pytest.raises((ValueError, FileNotFoundError), match=re.escape(message)):
        validate(_compose(["+experiment=bert_tiny", f"paths.run_dir={tmp_path}", override]))


def test_a_misspelt_key_of_a_familys_own_model_fails_before_any_work(tmp_path):
    """experiment=bert_vs_gpt: GPT's model is gpt.model (beside BERT's `model`), whose config is checked as model's."""
    cfg = _compose(["+experiment=bert_vs_gpt", f"paths.run_dir={tmp_path}", "+gpt.model.config.n_embdd=32"])
    with pytest.raises(ValueError, match=re.escape("did you mean gpt.model.config.n_embd")):
        validate(cfg)


def test_a_family_block_and_phase2_take_typed_values_and_phase2_keeps_pretrains_where_null(tmp_path):
    from pipeline.bert.pretrain import PHASES

    cfg = _compose(["+experiment=bert_base", f"paths.run_dir={tmp_path}", "pretrain_phase2.accumulate_grad_batches=4",
                    "pretrain_phase2.electra.generator_layers=2"])
    phase2 = PHASES[1].settings(cfg)
    assert phase2.accumulate_grad_batches == 4 and PHASES[1].max_seq_length(cfg) == 512
    assert phase2.optimizer == cfg.pretrain.optimizer and phase2.batch_size == cfg.pretrain_phase2.batch_size
    # a nested block key by key: phase 2's generator depth, pretrain's loss weight
    assert (phase2.electra.generator_layers, phase2.electra.discriminator_weight) == (
        2, cfg.pretrain.electra.discriminator_weight)


def test_a_composed_config_pickles_as_a_sweep_sends_it_to_its_trials(tmp_path):
    """The schema's classes made at import (the root, a shared block with a family's keys, phase 2's) are found by
    name, as pickle needs them to be in the Ray worker that runs a trial."""
    cfg = _compose(["+experiment=bert_base", f"paths.run_dir={tmp_path}"])
    copy = pickle.loads(pickle.dumps(cfg))
    assert copy == cfg and type(copy.pretrain.optimizer) is type(cfg.pretrain.optimizer)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_unknown_experiment_lists_the_available_ones():
    result = _cli("+experiment=no_such_experiment")
    assert result.returncode != 0
    assert "no_such_experiment" in result.stderr and "bert_tiny" in result.stderr


@pytest.mark.parametrize("override, message", [
    ("pipeline.stages=[prepare,pretrain]", "stage 'pretrain' is now 'bert_pretrain'; write "
                                           "pipeline.stages=[prepare,bert_pretrain]"),
    ("pipeline.stages=[tokenizer,examples]", "stage 'tokenizer' is now 'bert_tokenizer'; stage 'examples' is now "
                                             "'bert_examples'"),
    ("pipeline.until=pretrain_phase2", "stage 'pretrain_phase2' is now 'bert_pretrain_phase2'"),
    ("+pipeline.force=[piece_vectors]", "stage 'piece_vectors' is now 'bert_piece_vectors'"),
    ("finetune.models=[pretrained,random_init,elmo]", "finetune.models kind 'pretrained' is now 'bert'; "
                                                      "finetune.models kind 'random_init' is now 'bert_random'; "
                                                      "write finetune.models=[bert,bert_random,elmo]"),
    ("finetune.models=[external]", "kind 'external' is now 'bert_external'"),
])
def test_an_old_bert_name_fails_naming_the_new_one(override, message):
    """BERT's stages and fine-tune kinds carry the family's name, as every other family's do (issue 38)."""
    from pipeline.config import check_renamed_names

    with pytest.raises(SystemExit, match=re.escape(message)):
        check_renamed_names(["+experiment=bert_tiny", override])
    check_renamed_names(["pipeline.stages=[prepare,bert_pretrain]", "finetune.models=[bert,elmo]", "pretrain.lr=1"])


@pytest.mark.parametrize("override", ["+model.config.fast_kernels=false", "gpt.model.config.fast_kernels=false"])
def test_the_kernels_switch_that_was_a_model_setting_names_the_runs_setting(override):
    from pipeline.config import check_renamed_names

    with pytest.raises(SystemExit, match=re.escape("write trainer.fast_kernels=false")):
        check_renamed_names(["+experiment=bert_tiny", override])
    assert _compose(["+experiment=bert_tiny", "trainer.fast_kernels=false"]).trainer.fast_kernels is False


@pytest.mark.parametrize("override, message", [
    ("pretrain.whole_word_masking=true", "write pretrain.masking=whole_word"),
    ("+pretrain_phase2.whole_word_masking=false", "write pretrain_phase2.masking=token"),
])
def test_the_whole_word_switch_names_the_masking_unit_that_replaced_it(override, message):
    from pipeline.config import check_renamed_names

    with pytest.raises(SystemExit, match=re.escape(message)):
        check_renamed_names(["+experiment=bert_tiny", override])
    assert _compose(["+experiment=bert_tiny", "pretrain.masking=span"]).pretrain.masking == "span"


@pytest.mark.parametrize("override, message", [
    ("pretrain.freeze_embeddings=true", "write pretrain.freeze_embeddings=all"),
    ("finetune.freeze_embeddings=false", "write finetune.freeze_embeddings=none"),
    ("gpt.pretrain.freeze_embeddings=True", "write gpt.pretrain.freeze_embeddings=all"),
])
def test_the_frozen_embeddings_switch_names_the_rows_that_replaced_it(override, message):
    """freeze_embeddings names the rows it keeps (all | with_vector | none), in pretraining and fine-tuning alike."""
    from pipeline.config import check_renamed_names

    with pytest.raises(SystemExit, match=re.escape(message)):
        check_renamed_names(["+experiment=bert_tiny", override])
    for rows in ("all", "with_vector", "none"):
        cfg = _compose(["+experiment=gpt_tiny", f"pretrain.freeze_embeddings={rows}",
                        f"gpt.pretrain.freeze_embeddings={rows}", f"finetune.freeze_embeddings={rows}"])
        assert cfg.pretrain.freeze_embeddings == cfg.gpt.pretrain.freeze_embeddings == rows
        assert cfg.finetune.freeze_embeddings == rows


def test_the_old_names_are_gone_and_the_new_ones_are_the_graphs():
    from pipeline.bert.pretrain import TAPT
    from pipeline.config import RENAMED_KINDS, RENAMED_STAGES
    from pipeline.downstream.finetune import MODEL_KINDS
    from pipeline.stages import STAGES

    assert not set(RENAMED_STAGES) & set(STAGES) and set(RENAMED_STAGES.values()) <= set(STAGES)
    assert not set(RENAMED_KINDS) & set(MODEL_KINDS) and set(RENAMED_KINDS.values()) <= set(MODEL_KINDS)
    # task-adaptive pretraining's stages came after the renaming: they never had another name
    assert {name for name in STAGES if name.startswith("bert_")} == {*RENAMED_STAGES.values(), TAPT.examples,
                                                                       TAPT.stage}


def test_the_command_line_names_the_new_stage_before_any_work():
    result = _cli("pipeline.stages=[pretrain]")
    assert result.returncode != 0
    assert "stage 'pretrain' is now 'bert_pretrain'; write pipeline.stages=[bert_pretrain]" in result.stderr


def test_help_lists_the_config_groups_and_nothing_else():
    result = _cli("--help")
    assert result.returncode == 0
    listed = result.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = {line.split(":")[0] for line in listed.splitlines()[2:] if ":" in line}
    assert groups == {p.name for p in CONF_DIR.iterdir() if p.is_dir()}  # not `task` (tasks/), not the schema



def test_an_override_into_a_null_block_names_the_block_that_stands_in_for_it():
    """gpt.model is null in a GPT-only run (GPT reads `model`); Hydra would fail inside OmegaConf with a traceback."""
    from pipeline.config import check_overrides_into_null_blocks, null_standins

    assert null_standins() == {"gpt.model": "model"}
    with pytest.raises(SystemExit, match=re.escape("error: gpt.model.config.n_layer=4: gpt.model is null in this run, "
                                                   "so model stands in for it; override model.config.n_layer=4")):
        check_overrides_into_null_blocks(["+experiment=gpt_tiny", "gpt.model.config.n_layer=4"], _compose)
    check_overrides_into_null_blocks(["+experiment=bert_vs_gpt", "gpt.model.config.name=gpt_mini"], _compose)
    check_overrides_into_null_blocks(["+experiment=gpt_tiny", "+gpt.model.config.n_layer=4"], _compose)  # adds one


def test_a_whole_map_override_names_the_overrides_that_replace_it():
    """Issue 39, defect 8: `senteval.tasks={SUBJ: {...}}` failed with "Key 'SUBJ' is not in struct", and a map of
    names already there merged silently into the configured tasks instead of replacing them."""
    drop = ("~senteval.tasks.MR ~senteval.tasks.SICKEntailment ~senteval.tasks.SICKRelatedness ~senteval.tasks.MRPC "
            "+senteval.tasks.NAME='{...}'")
    result = _cli("+experiment=bert_tiny", "senteval.tasks={SUBJ: {kind: subj, path: SUBJ}}")
    assert result.returncode != 0
    assert ("error: senteval.tasks={SUBJ: {kind: subj, path: SUBJ}}: senteval.tasks is a map of names, and an "
            "override of the whole map would merge into the names it has (MR, SICKEntailment, SICKRelatedness, MRPC)"
            ) in result.stderr and drop in result.stderr
    from pipeline.config import check_whole_map_overrides

    with pytest.raises(SystemExit, match=re.escape(drop)):  # before, it kept the other three tasks
        check_whole_map_overrides(["+experiment=bert_tiny", "senteval.tasks={MR: {kind: mr, path: MR}}"], _compose)


@pytest.mark.parametrize("experiment, block", [("gpt_tiny", "pretrain"), ("gpt_tiny_zh", "pretrain"),
                                               ("bert_vs_gpt", "gpt.pretrain"), ("seq2seq_tiny", "gpt.pretrain")])
def test_gpts_pretraining_recipe_is_stated_once_and_reaches_every_block_that_pretrains_a_gpt(experiment, block):
    recipe = OmegaConf.load(CONF_DIR / "recipe" / "gpt_pretrain.yaml")
    settings = OmegaConf.select(_compose([f"+experiment={experiment}"]), block)
    assert {key: settings[key] for key in recipe} == {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95]}
    restated = [p.name for p in (CONF_DIR / "experiment").glob("*.yaml") if "0.95]" in p.read_text()]
    assert restated == [], f"{restated} restate GPT's betas: pick /recipe@<block>: gpt_pretrain instead"
