"""BERT's phase 2 on a tiny corpus: longer examples, phase 1's weights continued, its own cache entry and exact
resume, and the downstream stages reading its encoder."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.bert import BertForPreTraining, load_pretrained
from pipeline.bert.pretrain import HEADS_FILE, PRETRAINING, _build_model
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import MARKER, StageContext, StageFailed, execute_stage, plan
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import TinyRun, tiny_config

PHASE2 = [
    "pipeline.stages=[prepare,bert_tokenizer,bert_examples,bert_pretrain,bert_examples_phase2,bert_pretrain_phase2,finetune,report]",
    # phase 1 trains at 32 (TINY_OVERRIDES) with the table phase 2 needs, as bert_base does at 128 with 512
    "model.config.max_position_embeddings=256", "pretrain.max_steps=10",
    # phase 2 exists to train the positions of a learned table that phase 1 never reached (bert_tiny's default,
    # relative positions, has no table)
    "model.config.position_embedding_type=learned",
    # BERT's own blocks, as in bert_base: what transformers' BertModel expresses, so both phases also write hf/
    "model.config.pre_layer_norm=false",
    "pretrain_phase2.max_seq_length=256", "pretrain_phase2.max_steps=10", "pretrain_phase2.batch_size=4",
    "pretrain_phase2.warmup_steps=2", "pretrain_phase2.max_predictions_per_seq=40",
    "++pretrain_phase2.checkpoint_every_steps=5", "finetune.models=[bert]", "finetune.random_twins=false",
    "finetune.baselines=[majority_class]",
    "report.attention_sentence='the king saw the ship'",
]
BEFORE_DOWNSTREAM = ("prepare", "bert_tokenizer", "bert_examples", "bert_pretrain", "bert_examples_phase2",
                     "bert_pretrain_phase2")


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> TinyRun:
    tiny = TinyRun(tiny_config(tmp_path_factory.mktemp("phase2"), PHASE2))
    for name in BEFORE_DOWNSTREAM:
        tiny.run_stage(name)
    return tiny


def _root(run: TinyRun) -> Path:
    return Path(run.cfg.paths.cache_dir).parent


def _lengths(examples_dir: Path) -> list[int]:
    return [len(ids) for f in sorted(examples_dir.glob("examples-*.arrow"))
            for ids in read_arrow(f).column("input_ids").to_pylist()]


def _train_losses(stage_dir: Path) -> dict[int, float]:
    with open(stage_dir / "loss_curve.csv") as f:
        return {int(r["step"]): float(r["value"]) for r in csv.DictReader(f) if r["name"] == "train/loss"}


def test_phase2_examples_are_built_at_the_phase2_length(run):
    phase1, phase2 = _lengths(run.stage_dir("bert_examples")), _lengths(run.stage_dir("bert_examples_phase2"))
    assert max(phase1) <= 32
    assert 128 < max(phase2) <= 256  # sequences phase 1 never saw, up to phase 2's length


def test_phase2_starts_from_phase1s_final_weights(run):
    phase1 = run.stage_dir("bert_pretrain")
    ctx = StageContext(run.cfg, "bert_pretrain_phase2", run.stage_dir("bert_pretrain_phase2"),
                       {u: run.stage_dir(u) for u in run.plan.stages["bert_pretrain_phase2"].upstream})
    task = PRETRAINING["bert_pretrain_phase2"]
    initial = task.build_module(ctx, task.settings(run.cfg)).model.state_dict()
    expected = {**{f"bert.{k}": v for k, v in load_pretrained(phase1 / "encoder").state_dict().items()},
                **load_file(str(phase1 / HEADS_FILE))}
    assert set(expected) == set(initial) - {BertForPreTraining.TIED_DECODER}  # tied to the word embeddings
    for name, tensor in expected.items():
        torch.testing.assert_close(initial[name], tensor, rtol=0, atol=0, msg=name)
    torch.manual_seed(run.cfg.seed)
    fresh = _build_model(run.cfg, run.cfg.pretrain, 300).state_dict()  # what phase 2 would start from without phase 1
    assert not torch.equal(fresh["cls.seq_relationship.weight"], expected["cls.seq_relationship.weight"])


def test_phase2_trains_its_own_steps_and_writes_encoder_and_heads(run):
    summary = (run.stage_dir("bert_pretrain_phase2") / MARKER).read_text()
    out = run.stage_dir("bert_pretrain_phase2")
    assert '"steps": 10' in summary and '"max_seq_length": 256' in summary
    assert f'"initialised_from": "{run.stage_dir("bert_pretrain")}"' in summary
    assert sorted(_train_losses(out)) == list(range(1, 11))
    assert (out / HEADS_FILE).is_file()
    before = load_pretrained(run.stage_dir("bert_pretrain") / "encoder").state_dict()
    after = load_pretrained(out / "encoder").state_dict()
    assert not torch.equal(before["embeddings.position_embeddings.weight"],
                           after["embeddings.position_embeddings.weight"])


def test_changing_only_a_phase2_setting_reruns_phase2_and_not_phase1(run):
    def pending(extra: list[str]) -> list[str]:
        the_plan = plan(tiny_config(_root(run), [*PHASE2, *extra]), STAGES)
        return [name for name in the_plan.order if not the_plan.cached[name]]

    assert pending([]) == ["finetune", "report"]  # the fixture ran the rest
    assert pending(["pretrain_phase2.lr=5e-4"]) == ["bert_pretrain_phase2", "finetune", "report"]
    assert pending(["pretrain_phase2.max_seq_length=200"]) == ["bert_examples_phase2", "bert_pretrain_phase2",
                                                               "finetune", "report"]
    assert pending(["pretrain.lr=5e-4"]) == ["bert_pretrain", "bert_pretrain_phase2", "finetune", "report"]


def test_finetune_and_report_read_the_phase2_encoder(run, monkeypatch):
    read = []

    def recording_load_pretrained(path):
        read.append(Path(path))
        return load_pretrained(path)

    monkeypatch.setattr("pipeline.bert.downstream.load_ours_or_hf", recording_load_pretrained)
    monkeypatch.setattr("models.bert.load_pretrained", recording_load_pretrained)  # the report's attention heat-map
    assert run.plan.stages["finetune"].upstream == ("bert_tokenizer", "bert_pretrain_phase2")
    run.run_stage("finetune")
    run.run_stage("report")
    assert read and set(read) == {run.stage_dir("bert_pretrain_phase2") / "encoder"}
    md = (run.stage_dir("report") / "results.md").read_text()
    assert "## Pretraining (bert_pretrain)" in md and "## Pretraining (bert_pretrain_phase2)" in md


def test_phase2_resumes_exactly_from_its_checkpoint(run, tmp_path):
    finished = run.stage_dir("bert_pretrain_phase2")
    out = tmp_path / "bert_pretrain_phase2"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy(finished / "checkpoints" / "step-000005.ckpt", out / "checkpoints")  # as if killed after step 5
    inputs = {u: (run.plan.dirs[u], run.plan.hashes[u]) for u in run.plan.stages["bert_pretrain_phase2"].upstream}
    summary = execute_stage(run.plan.stages, run.cfg, "bert_pretrain_phase2", run.plan.hashes["bert_pretrain_phase2"],
                            out, inputs, None)
    assert summary["resumed_from_step"] == 5 and summary["steps"] == 10
    resumed, uninterrupted = _train_losses(out), _train_losses(finished)
    assert sorted(resumed) == list(range(1, 11))
    torch.testing.assert_close([resumed[s] for s in range(6, 11)], [uninterrupted[s] for s in range(6, 11)],
                               rtol=0, atol=0)


def test_phase2_longer_than_the_position_table_fails_with_what_to_set(run):
    def message(length: int) -> str:
        return (rf"pretrain_phase2.max_seq_length={length} is longer than the model's position table "
                r"\(model.config.max_position_embeddings=128\); set "
                rf"model.config.max_position_embeddings={length}")

    def config(length: int):
        return tiny_config(_root(run), [*PHASE2, "model.config.max_position_embeddings=128",
                                        f"pretrain_phase2.max_seq_length={length}"])

    with pytest.raises(ValueError, match=message(200)):  # at start-up, before any stage builds examples
        validate(config(200))
    with pytest.raises(StageFailed, match=message(256)):  # the stage itself refuses too (e.g. run without the CLI)
        TinyRun(config(256)).run_stage("bert_pretrain_phase2")


@pytest.mark.parametrize("stage, length", [("bert_pretrain", 32), ("bert_pretrain_phase2", 256)])
def test_each_phase_writes_what_transformers_loads_with_the_length_it_trained_at(run, stage, length):
    transformers = pytest.importorskip("transformers")  # test-only dependency
    out = run.stage_dir(stage)
    assert json.loads((out / "stage.json").read_text())["hf"] == "hf/"
    hf_model = transformers.AutoModel.from_pretrained(out / "hf", attn_implementation="eager").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out / "hf")
    assert hf_tok.model_max_length == length and hf_model.config.max_position_embeddings == 256
    assert hf_tok.do_lower_case == run.cfg.tokenizer.lowercase
    ours = load_pretrained(out / "encoder").eval()
    # run.cfg.tokenizer.lowercase: the upper-case words encode as the lower-case ones the tokenizer was trained on
    batch = hf_tok(["and the old men sang", "The KING saw the ship"], padding=True, return_tensors="pt")
    upper = batch["input_ids"][1][batch["attention_mask"][1].bool()]  # padded: the first sentence is longer
    assert upper.tolist() == hf_tok("the king saw the ship")["input_ids"]
    with torch.no_grad():
        theirs = hf_model(**batch).last_hidden_state
        mine, _ = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(mine[real], theirs[real], rtol=0, atol=1e-5)
