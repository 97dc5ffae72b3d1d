"""Task-adaptive pretraining (Gururangan et al. 2020): bert_examples_tapt holds the texts fine-tuning may train on and
never a dev or held-out selection text, its cache key follows what it reads, and bert_pretrain_tapt continues phase 1
into the encoder that fine-tuning reads."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from data_prep.corpus.tokenizer import load_tokenizer, train_wordpiece
from models.bert import load_pretrained
from pipeline.bert.data_stages import task_examples, wordpiece_ids
from pipeline.downstream.task_data import tsv_splits
from pipeline.downstream.tasks import load_task
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import MARKER, StageContext, plan
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import TinyRun, tiny_config

TAPT = ["pipeline.stages=[bert_pretrain,bert_pretrain_tapt,finetune]", "finetune.selection_fraction=0.25",
        "finetune.models=[bert]", "finetune.random_twins=false", "finetune.controls=false",
        "finetune.baselines=[majority_class]", "pretrain_tapt.max_steps=6", "pretrain_tapt.batch_size=8",
        "pretrain_tapt.warmup_steps=2", "pretrain_tapt.val_every_steps=3", "pretrain_tapt.max_seq_length=24"]
WORDS = ["good", "bad", "dull", "moving", "film", "plot", "cast", "score", "scenes", "ending"]


def _write_task(root: Path, n_train: int = 40, n_dev: int = 12) -> Path:
    """An SST-2-layout task whose every sentence is told apart by its number, dev's numbered past train's."""
    task = root / "task"
    task.mkdir(parents=True)
    for name, numbers in (("train.tsv", range(n_train)), ("dev.tsv", range(n_train, n_train + n_dev))):
        with open(task / name, "w", newline="") as f:
            out = csv.writer(f, delimiter="\t", lineterminator="\n")
            out.writerow(["sentence", "label"])
            out.writerows([f"the {WORDS[i % 10]} {WORDS[i // 10 % 10]} number {i}", i % 2] for i in numbers)
    return task


def _ids(tok, texts: list[str]) -> set[tuple[int, ...]]:
    return set(map(tuple, wordpiece_ids(tok, pa.array(texts))))


def test_tapt_instances_are_the_train_pool_and_no_dev_or_held_out_text(tmp_path):
    task_dir = _write_task(tmp_path)
    cfg = tiny_config(tmp_path, TAPT)
    task = load_task("sst2")
    train, held_out, _ = tsv_splits(task, task_dir, None, cfg.seed, 0.25)
    everything, dev, _ = tsv_splits(task, task_dir, None, cfg.seed)
    tokenizer_dir, out = tmp_path / "bert_tokenizer", tmp_path / "bert_examples_tapt"
    out.mkdir()
    train_wordpiece(everything.texts_a + dev.texts_a, tokenizer_dir, vocab_size=200, min_frequency=1)
    ctx = StageContext(cfg, "bert_examples_tapt", out, {"bert_tokenizer": tokenizer_dir})

    summary = task_examples(ctx, length_key="pretrain_tapt.max_seq_length")

    tok = load_tokenizer(tokenizer_dir)
    instances = read_arrow(out / "examples-00000.arrow")
    texts = [tuple(ids[1:-1]) for ids in instances.column("input_ids").to_pylist()]  # less [CLS] and [SEP]
    assert set(instances.column("token_type_ids").to_pylist()[0]) == {0}  # one segment
    assert summary["texts"] == summary["instances"] == len(texts) == len(train.texts_a) == 30  # 40 less a quarter
    assert set(texts) == _ids(tok, train.texts_a)
    assert not set(texts) & _ids(tok, held_out.texts_a)  # the selection split's held-out quarter of train
    assert not set(texts) & _ids(tok, dev.texts_a)
    assert len(_ids(tok, held_out.texts_a)) == 10 and len(_ids(tok, dev.texts_a)) == 12  # all told apart


def test_tapt_examples_are_keyed_by_the_task_its_selection_split_and_the_seed(tmp_path):
    task_dir = _write_task(tmp_path)

    def hashes(*extra: str) -> dict[str, str]:
        return plan(tiny_config(tmp_path, [*TAPT, *extra]), STAGES).hashes

    base = hashes()
    for changed in (["finetune.selection_fraction=0.1"], ["seed=7"], ["finetune.max_train_examples=20"],
                    ["finetune.task=rotten_tomatoes", "finetune.data_dir=null"]):
        assert hashes(*changed)["bert_examples_tapt"] != base["bert_examples_tapt"], changed
    assert hashes("finetune.selection_fraction=0.1")["bert_pretrain"] == base["bert_pretrain"]
    assert hashes("pretrain_tapt.lr=5e-4")["bert_examples_tapt"] == base["bert_examples_tapt"]
    (task_dir / "train.tsv").write_text((task_dir / "train.tsv").read_text() + "the film ends\t1\n")
    edited = hashes()
    assert edited["bert_examples_tapt"] != base["bert_examples_tapt"]
    assert edited["bert_pretrain_tapt"] != base["bert_pretrain_tapt"]


@pytest.mark.parametrize("extra, message", [
    (["pipeline.stages=[bert_pretrain_phase2,bert_pretrain_tapt]"],
     r"bert_pretrain_tapt continues bert_pretrain, as bert_pretrain_phase2 does.*remove one of them"),
    (["pretrain_tapt.next_sentence_prediction=true"],
     r"pretrain_tapt's instances \(one text each\) have no second segment to predict; set "
     r"pretrain_tapt.next_sentence_prediction=false \(RoBERTa's masked LM alone\)$"),
])
def test_tapt_settings_it_cannot_run_fail_at_start_up(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        validate(tiny_config(tmp_path, [*TAPT, *extra]))


@pytest.mark.slow
def test_tapt_continues_phase_1_and_fine_tuning_reads_its_encoder(tmp_path, ray_session):
    run = TinyRun(tiny_config(tmp_path, TAPT))
    for name in ("prepare", "bert_tokenizer", "bert_examples", "bert_pretrain", "bert_examples_tapt"):
        run.run_stage(name)
    summary = run.run_stage("bert_pretrain_tapt")
    assert summary["steps"] == 6 and summary["initialised_from"] == str(run.stage_dir("bert_pretrain"))
    assert summary["final_val_nsp_acc"] is None  # masked LM alone
    assert (run.stage_dir("bert_pretrain_tapt") / MARKER).is_file()
    before = load_pretrained(run.stage_dir("bert_pretrain") / "encoder").state_dict()
    after = load_pretrained(run.stage_dir("bert_pretrain_tapt") / "encoder").state_dict()
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    assert run.plan.stages["finetune"].upstream == ("bert_tokenizer", "bert_pretrain_tapt")
    run.run_stage("finetune")
    rows = json.loads((run.stage_dir("finetune") / "results.json").read_text())
    assert {(row["model"], row["scored_on"]) for row in rows if row["model"] == "bert"} == {("bert", "train_holdout")}
