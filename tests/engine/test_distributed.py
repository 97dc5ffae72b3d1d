"""Data-parallel pretraining in 2 Ray Train workers on the CPU: DDP, DeepSpeed ZeRO-2/3 with consolidation, phase 2,
and ELMo and Skip-Thought on the same harness."""
from __future__ import annotations

import csv
import math
import shutil
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch

from models.bert import BertConfig, BertForPreTraining, load_pretrained
from pipeline.engine import distributed
from pipeline.engine.checkpoints import KEEP_CHECKPOINTS
from pipeline.engine.dag import MARKER, StageContext, StageFailed, execute_stage
from pipeline.engine.deepspeed_loop import checkpoint_tags, consolidated_state_dict
from pipeline.engine.distributed import DistributedSettings, deepspeed_config, lightning_strategy, whole_parameters
from pipeline.engine.pretraining import pretrain
from pipeline.families import FAMILIES
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import TINY_FAMILIES, TinyRun, family_config, tiny_config

TWO_WORKER_OVERRIDES = ["++pretrain.checkpoint_every_steps=10", "pretrain.max_steps=20"]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("distributed")


def tiny_run(root: Path, trainer: list[str]) -> TinyRun:
    run = TinyRun(tiny_config(root, [*TWO_WORKER_OVERRIDES, *trainer]))
    # cached after the first run: they ignore trainer.* (word2vec: the w2v_mean row of the fine-tuning that follows,
    # in the runs that fine-tune)
    for name in ("prepare", "bert_tokenizer", "bert_examples", "word2vec"):
        if name in run.plan.order:
            run.run_stage(name)
    return run


def train_losses(out_dir: Path) -> list[float]:
    with open(out_dir / "loss_curve.csv") as f:
        return [float(r["value"]) for r in csv.DictReader(f) if r["name"] == "train/loss"]


@pytest.mark.parametrize("overrides, message", [
    (["trainer=ddp_cpu", "distributed.num_workers=1"], "needs distributed.num_workers >= 2"),
    (["trainer=ddp_cpu", "distributed.deepspeed={stage: 3, offload_optimizer: false, offload_parameters: false}"],
     "needs trainer.strategy=deepspeed"),
    (["distributed.deepspeed.offload_optimizer=true"], "needs trainer.strategy=deepspeed"),  # not ignored: trainer=cpu
    (["trainer=deepspeed", "distributed.deepspeed.offload_parameters=true"], "needs ZeRO stage 3"),
    (["trainer=deepspeed", "distributed.deepspeed.stage=1", "trainer.devices=4"], "set distributed.num_workers"),
    # DeepSpeed on the CPU trains without a Lightning Trainer: what only a Trainer applies would be ignored
    (["trainer=deepspeed", "trainer.accelerator=cpu", "+debug=fdr"], "trainer.fast_dev_run: DeepSpeed on"),
    (["trainer=deepspeed", "trainer.accelerator=cpu", "callbacks=lr_monitor"], "callbacks.lr_monitor"),
    (["trainer=ddp_cpu", "ray.num_cpus=1"], "need a CPU each, and this run's Ray has ray.num_cpus=1"),
])
def test_impossible_trainer_settings_fail_before_any_work(tmp_root, overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(tiny_config(tmp_root, overrides))


@pytest.mark.parametrize("stage, offload_optimizer, offload_parameters", [
    (1, False, False), (2, False, False), (2, True, False), (3, False, False), (3, True, True)])
def test_one_deepspeed_trainer_config_gives_every_zero_stage_and_offload(tmp_root, stage, offload_optimizer,
                                                                          offload_parameters):
    cfg = tiny_config(tmp_root, ["trainer=deepspeed", "trainer.accelerator=cpu", f"distributed.deepspeed.stage={stage}",
                                 f"distributed.deepspeed.offload_optimizer={offload_optimizer}",
                                 f"distributed.deepspeed.offload_parameters={offload_parameters}"])
    validate(cfg)
    assert cfg.trainer.strategy == "deepspeed" and cfg.distributed.num_workers == 2
    assert dict(cfg.distributed.deepspeed) == {"stage": stage, "offload_optimizer": offload_optimizer,
                                               "offload_parameters": offload_parameters}


def _settings(precision: str, strategy: str = "deepspeed", zero_stage: int | None = 2) -> DistributedSettings:
    return DistributedSettings(strategy=strategy, num_workers=1, accelerator="gpu", devices="auto",
                               precision=precision, zero_stage=zero_stage, offload_optimizer=False,
                               offload_parameters=False, accumulate_grad_batches=1)


@pytest.mark.parametrize("resolved, bf16, fp16", [("bf16-mixed", True, False), ("16-mixed", False, True),
                                                  ("32-true", False, False)])
def test_the_deepspeed_json_takes_the_precision_auto_resolves_to(monkeypatch, resolved, bf16, fp16):
    """Issue 18: bf16 was read off the raw string, so trainer.precision=auto (the default) never enabled it on a GPU
    while the run summary, from Lightning's resolution, said bf16."""
    monkeypatch.setattr(distributed, "resolve_precision", lambda p: resolved if p == "auto" else p)
    ds = deepspeed_config(_settings("auto"), micro_batch_size=4, grad_clip=1.0)
    assert ds["bf16"] == {"enabled": bf16} and ds["fp16"] == {"enabled": fp16}
    assert deepspeed_config(_settings("32-true"), 4, 1.0)["bf16"] == {"enabled": False}


@pytest.mark.parametrize("num_workers", [1, 2])  # Lightning's DeepSpeedStrategy; Ray Train's subclass of it
def test_lightning_takes_the_deepspeed_json_with_the_trainers_gradient_accumulation(num_workers):
    """Found on a GPU: Lightning refuses a DeepSpeed JSON that sets gradient_accumulation_steps, which
    it writes itself from the Trainer's accumulate_grad_batches, so every Lightning DeepSpeed run failed at setup.
    Lightning's own formatting of the JSON runs here on the CPU, where its strategy cannot train."""
    from types import SimpleNamespace

    settings = replace(_settings("32-true"), num_workers=num_workers, accumulate_grad_batches=4)
    ds = deepspeed_config(settings, micro_batch_size=8, grad_clip=1.0)
    strategy = lightning_strategy(settings, ds)
    strategy._lightning_module = SimpleNamespace(trainer=SimpleNamespace(accumulate_grad_batches=4,
                                                                         gradient_clip_val=None))
    strategy._format_batch_size_and_grad_accum_config()
    assert strategy.config["gradient_accumulation_steps"] == 4
    assert strategy.config["train_micro_batch_size_per_gpu"] == 8 and strategy.config["gradient_clipping"] == 1.0
    assert ds["gradient_accumulation_steps"] == 4  # the CPU loop, which has no Trainer, still reads it


@pytest.mark.parametrize("strategy, zero_stage, gathers", [("deepspeed", 3, True), ("deepspeed", 2, False),
                                                           ("ddp", None, False)])
def test_only_zero3_gathers_the_whole_parameters_before_the_encoder_is_written(monkeypatch, strategy, zero_stage,
                                                                                gathers):
    import deepspeed

    gathered = []

    @contextmanager
    def record(params, modifier_rank=None):
        gathered.append(list(params))
        yield

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", record)
    model = BertForPreTraining(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32))
    with whole_parameters(model, _settings("32-true", strategy, zero_stage)):
        pass
    assert bool(gathered) == gathers
    if gathers:
        assert {id(p) for p in gathered[0]} == {id(p) for p in model.parameters()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: Lightning's DeepSpeedStrategy")
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_lightning_deepspeed_on_a_gpu_writes_whole_weights_and_prunes_its_checkpoints(tmp_path, ray_session,
                                                                                       zero_stage):
    run = TinyRun(tiny_config(tmp_path, ["++pretrain.checkpoint_every_steps=5", "pretrain.max_steps=20",
                                         "trainer=deepspeed", f"distributed.deepspeed.stage={zero_stage}",
                                         "trainer.accelerator=gpu", "distributed.num_workers=1",
                                         "trainer.precision=auto"]))
    for name in ("prepare", "bert_tokenizer", "bert_examples"):
        run.run_stage(name)
    summary = run.run_stage("bert_pretrain")
    out = run.stage_dir("bert_pretrain")
    encoder = load_pretrained(out / "encoder")
    word = encoder.embeddings.word_embeddings.weight
    assert word.shape[0] % 64 == 0 and word.abs().sum() > 0  # not ZeRO-3's empty shard
    assert len(list((out / "checkpoints").iterdir())) == KEEP_CHECKPOINTS
    assert summary["precision"] == ("bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed")
    # Killed after its last checkpoint, before the marker: the rerun resumes at max_steps and trains nothing. Its
    # validation once ran in a second strategy set-up (trainer.validate), which left ZeRO-3's embeddings on the CPU.
    (out / MARKER).unlink()
    rerun = run.run_stage("bert_pretrain")
    assert rerun["resumed_from_step"] == 20 and rerun["steps"] == 20
    assert rerun["final_val_loss"] == pytest.approx(summary["final_val_loss"], rel=1e-2)
    torch.testing.assert_close(load_pretrained(out / "encoder").embeddings.word_embeddings.weight, word, rtol=0,
                               atol=1e-3)


def test_every_stage_that_depends_on_the_data_parallel_settings_honours_them(tmp_path):
    """ELMo and Skip-Thought once trained with a bare Trainer and ignored trainer=ddp_cpu / deepspeed_* (issue 16):
    a stage whose outputs depend on the whole trainer block must run on the pretraining harness; one that trains in
    one process (finetune) depends on the settings it applies only."""
    on_harness = {name for name, stage in STAGES.items()
                  if isinstance(stage.fn, partial) and stage.fn.func is pretrain}
    assert on_harness == {name for family in FAMILIES for name in family.pretraining_stages}
    keys = {name: stage.config_keys(tiny_config(tmp_path)) if callable(stage.config_keys) else stage.config_keys
            for name, stage in STAGES.items()}
    assert {name for name, stage_keys in keys.items() if "trainer" in stage_keys} == on_harness
    assert not [key for key in keys["finetune"] if key in ("trainer.strategy", "trainer.devices")]


@pytest.mark.slow  # Ray Train start-up of 2 workers: 1-3 min on a loaded 2-core machine
def test_ddp_in_two_ray_train_workers(tmp_root, ray_session):
    run = tiny_run(tmp_root, ["trainer=ddp_cpu"])
    summary = run.run_stage("bert_pretrain")
    out = run.stage_dir("bert_pretrain")
    assert summary["workers"] == 2 and summary["steps"] == 20
    losses = train_losses(out)
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    # rank 0 alone writes: one checkpoint per save, no leftovers of concurrent writers
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000010.ckpt", "step-000020.ckpt"]
    assert load_pretrained(out / "encoder").config.num_hidden_layers == 2


@pytest.mark.slow  # Ray Train start-up plus DeepSpeed import in 2 workers: 2-4 min on 2 cores
def test_deepspeed_zero2_on_cpu_consolidates_and_fine_tunes(tmp_root, ray_session):
    run = tiny_run(tmp_root, ["trainer=deepspeed", "trainer.accelerator=cpu"])
    summary = run.run_stage("bert_pretrain")
    out = run.stage_dir("bert_pretrain")
    assert summary["workers"] == 2 and summary["zero_stage"] == 2 and math.isfinite(summary["final_val_loss"])
    assert all(math.isfinite(x) for x in train_losses(out))
    with open(out / "loss_curve.csv") as f:  # what the Lightning loop records too, for W&B and the report
        recorded = [(r["name"], int(r["step"]), float(r["value"])) for r in csv.DictReader(f)]
    for name in ("train/lr", "train/rows_per_s"):
        assert [step for n, step, _ in recorded if n == name] == list(range(1, 21)), name
        assert all(value > 0 for n, _, value in recorded if n == name), name
    checkpoints = out / "checkpoints"
    assert checkpoint_tags(checkpoints) == ["step-10", "step-20"]
    fp32 = consolidated_state_dict(checkpoints, "step-20")
    # ZeRO-2 keeps whole fp32 parameters on every rank: the engine's module weights, as DeepSpeed saved them
    engine_weights = torch.load(checkpoints / "step-20" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    for name, tensor in engine_weights.items():
        torch.testing.assert_close(fp32[name], tensor.float(), rtol=0, atol=0, msg=name)
    encoder = load_pretrained(out / "encoder")
    fresh = BertForPreTraining(BertConfig.from_dict(encoder.config.to_dict()))
    fresh.load_state_dict({k.removeprefix("model."): v for k, v in fp32.items()})
    for name, tensor in encoder.state_dict().items():
        torch.testing.assert_close(fresh.bert.state_dict()[name], tensor, rtol=0, atol=0, msg=name)

    results = run.run_stage("finetune")["results"]
    assert {r["model"] for r in results} >= {"bert", "bert_random"}
    assert (run.stage_dir("finetune") / MARKER).exists()


@pytest.mark.slow  # Ray Train start-up plus DeepSpeed import in 2 workers: ~45 s when the data stages are cached
def test_deepspeed_zero3_on_cpu_trains_the_tied_word_matrix(tmp_root, ray_session):
    """ZeRO-3 partitions every parameter and gathers it around each module's forward and backward: the word matrix
    that the lookup and the MLM decoder share (models.kernels.TiedWordGradient) must still train."""
    run = tiny_run(tmp_root, ["trainer=deepspeed", "distributed.deepspeed.stage=3", "trainer.accelerator=cpu"])
    summary = run.run_stage("bert_pretrain")
    losses = train_losses(run.stage_dir("bert_pretrain"))
    assert summary["zero_stage"] == 3 and len(losses) == 20 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) < sum(losses[:5])
    fp32 = consolidated_state_dict(run.stage_dir("bert_pretrain") / "checkpoints", "step-20")
    torch.testing.assert_close(fp32["model.cls.predictions.decoder.weight"],
                               fp32["model.bert.embeddings.word_embeddings.weight"], rtol=0, atol=0)


@pytest.mark.slow  # two Ray Train start-ups in 2 workers: 1-2 min each on 2 cores
@pytest.mark.parametrize("trainer", [["trainer=ddp_cpu"], ["trainer=deepspeed", "trainer.accelerator=cpu"]],
                         ids=["ddp", "zero2"])
def test_phase2_in_two_workers_starts_from_phase1(tmp_root, ray_session, trainer):
    """Phase 2 loads phase 1's encoder and heads in every worker (before DeepSpeed partitions the optimizer state):
    with lr 0 its final weights are exactly phase 1's."""
    run = tiny_run(tmp_root, [
        *trainer,
        "pipeline.stages=[prepare,bert_tokenizer,bert_examples,bert_pretrain,bert_examples_phase2,bert_pretrain_phase2]",
        "model.config.max_position_embeddings=64", "pretrain_phase2.max_seq_length=64", "pretrain_phase2.max_steps=4",
        "pretrain_phase2.batch_size=4", "pretrain_phase2.lr=0", "pretrain_phase2.max_predictions_per_seq=10",
        "++pretrain_phase2.checkpoint_every_steps=4"])
    run.run_stage("bert_pretrain")
    run.run_stage("bert_examples_phase2")
    summary = run.run_stage("bert_pretrain_phase2")
    assert summary["workers"] == 2 and summary["max_seq_length"] == 64
    assert summary.get("zero_stage") == (2 if "deepspeed" in trainer[0] else None)
    assert summary["initialised_from"] == str(run.stage_dir("bert_pretrain"))
    losses = train_losses(run.stage_dir("bert_pretrain_phase2"))
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    phase1 = load_pretrained(run.stage_dir("bert_pretrain") / "encoder").state_dict()
    phase2 = load_pretrained(run.stage_dir("bert_pretrain_phase2") / "encoder").state_dict()
    assert set(phase1) == set(phase2)
    for name, tensor in phase1.items():
        torch.testing.assert_close(phase2[name], tensor, rtol=0, atol=0, msg=name)


def evaluated_weights(run: TinyRun, family: str) -> dict[str, torch.Tensor]:
    """The weights of the encoder the evaluate stage builds from the pretraining stage's output (alone: not, e.g.,
    Skip-Thought's combine-skip, which also reads bi-skip's stage)."""
    record = next(f for f in FAMILIES if f.name == family)
    (encoder,) = [spec for name, spec in record.encoders.items() if not name.endswith(("_random", "_expanded"))
                  and set(spec.upstream(run.cfg)) & set(record.pretraining_stages)
                  == {TINY_FAMILIES[family].pretraining_stage}]
    upstream = encoder.upstream(run.cfg)
    built = encoder.build(StageContext(run.cfg, "evaluate", run.stage_dir("evaluate") if "evaluate" in run.plan.dirs
                                       else Path("unused"), {u: run.stage_dir(u) for u in upstream}))
    model = built.embedder.bilm if family == "elmo" else built.model
    return model.state_dict()


# ELMo with the sampled softmax: its sparse gradient averaged over gloo under DDP, made dense for DeepSpeed
@pytest.mark.slow  # Ray Train start-up of 2 workers (plus DeepSpeed's import): 1-4 min each on 2 cores
@pytest.mark.parametrize("family", ["elmo", "skip_thought", "gpt", "seq2seq"])
@pytest.mark.parametrize("trainer", [["trainer=ddp_cpu"], ["trainer=deepspeed", "trainer.accelerator=cpu"]],
                         ids=["ddp", "zero2"])
def test_families_train_in_two_workers_and_evaluate_their_final_weights(tmp_root, ray_session, family, trainer):
    run = TinyRun(family_config(tmp_root / family, family, [*TWO_WORKER_OVERRIDES, *trainer]))
    for name in TINY_FAMILIES[family].data_stages:  # cached after the first run: they ignore trainer.*
        run.run_stage(name)
    stage = TINY_FAMILIES[family].pretraining_stage
    summary = run.run_stage(stage)
    out = run.stage_dir(stage)
    assert summary["workers"] == 2 and summary["steps"] == 20 and math.isfinite(summary["final_val_loss"])
    losses = train_losses(out)
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    if "deepspeed" in trainer[0]:
        assert summary["zero_stage"] == 2 and checkpoint_tags(out / "checkpoints") == ["step-10", "step-20"]
        final = consolidated_state_dict(out / "checkpoints", "step-20")
    else:
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000010.ckpt", "step-000020.ckpt"]
        final = torch.load(out / "checkpoints" / "step-000020.ckpt", weights_only=False)["state_dict"]
    evaluated = evaluated_weights(run, family)
    assert set(evaluated) == {k.removeprefix("model.") for k in final}
    for name, tensor in evaluated.items():
        torch.testing.assert_close(tensor, final[f"model.{name}"].float(), rtol=0, atol=0, msg=name)

    # resumed from the step-10 checkpoint, each rank from its own position (and ELMo's rows' carried state)
    resumed = tmp_root / family / f"resumed-{trainer[0]}"
    (resumed / "checkpoints").mkdir(parents=True)
    step_10 = out / "checkpoints" / ("step-10" if "deepspeed" in trainer[0] else "step-000010.ckpt")
    (shutil.copytree if step_10.is_dir() else shutil.copy)(step_10, resumed / "checkpoints" / step_10.name)
    inputs = {u: (run.plan.dirs[u], run.plan.hashes[u]) for u in run.plan.stages[stage].upstream}
    assert execute_stage(run.plan.stages, run.cfg, stage, run.plan.hashes[stage], resumed, inputs,
                         None)["resumed_from_step"] == 10
    assert train_losses(resumed) == losses


@pytest.mark.slow  # Ray Train start-up of 2 workers: ~30-60 s on 2 cores
def test_a_diverged_run_in_two_workers_fails_with_the_setting_to_change(tmp_root, ray_session):
    """Every rank checks the same (averaged) loss, so all stop together; the stage's error is the rank's own message,
    not Ray's digest of every rank's traceback."""
    run = TinyRun(family_config(tmp_root / "skip_thought", "skip_thought",
                                [*TWO_WORKER_OVERRIDES, "trainer=ddp_cpu", "pretrain.lr=1e3"]))
    for name in TINY_FAMILIES["skip_thought"].data_stages:
        run.run_stage(name)
    with pytest.raises(StageFailed, match=r"failed: PretrainingDiverged: pretraining diverged: the training loss .* "
                                          r"lower pretrain.lr or raise pretrain.warmup_steps"):
        run.run_stage("skip_thought_pretrain")
    assert not (run.stage_dir("skip_thought_pretrain") / MARKER).exists()
