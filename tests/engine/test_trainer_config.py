"""The Trainer, its logger and callbacks built by `_target_` (issue 18): a Lightning Trainer argument given on the
command line or by the debug group reaches the Trainer, callbacks from the callbacks group run in pretraining, and
ckpt_path starts pretraining from a given checkpoint."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.profilers import SimpleProfiler

from pipeline import CONF_DIR
from pipeline.engine import training
from pipeline.engine.dag import MARKER, StageContext
from pipeline.engine.training import make_trainer
from pipeline.runner import validate
from tests.engine.test_resume import run_stage_into, train_losses
from tests.helpers import RESUME_OVERRIDES, TINY_FAMILIES, TinyRun, tiny_config


def built_trainer(tmp_path: Path, overrides: list[str], **kwargs):
    cfg = tiny_config(tmp_path, overrides)
    return cfg, make_trainer(StageContext(cfg, "bert_pretrain", tmp_path / "out"), [], **kwargs)


def test_a_trainer_argument_on_the_command_line_reaches_the_trainer(tmp_path):
    _, trainer = built_trainer(tmp_path, ["+trainer.fast_dev_run=true", "+trainer.max_time=00:00:30:00"])
    assert trainer.fast_dev_run is True
    assert trainer.fit_loop.max_steps == 1  # what fast_dev_run does to a Trainer
    assert [c for c in trainer.callbacks if isinstance(c, Timer)]  # what max_time adds
    _, trainer = built_trainer(tmp_path, ["+trainer.limit_train_batches=7"])
    assert trainer.limit_train_batches == 7


@pytest.mark.parametrize("bf16_instructions", [False, True])
def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_about_once(tmp_path, monkeypatch, capsys,
                                                                     bf16_instructions):
    """trainer.precision=bf16-mixed on such a CPU trained ~12x slower than fp32 without a word; fp32 and a CPU that
    computes bf16 say nothing, and a stage that builds many Trainers (finetune) says it once."""
    monkeypatch.setattr(training, "cpu_computes_bf16", lambda: bf16_instructions)
    training.warn_if_bf16_is_emulated.cache_clear()
    for _ in range(2):
        _, trainer = built_trainer(tmp_path, ["trainer.precision=bf16-mixed"])
    built_trainer(tmp_path, ["trainer.precision=32-true"])
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING: trainer.precision")]
    assert trainer.precision == "bf16-mixed"  # warned about, not changed
    assert warnings == [] if bf16_instructions else warnings == [
        "WARNING: trainer.precision=bf16-mixed on a CPU without bf16 instructions (neither AMX nor AVX512-BF16, or "
        "kept from torch by ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA): torch emulates bf16 here, many times slower "
        "than fp32; set trainer.precision=32-true, or trainer.precision=auto, "
        "which picks bf16 only where the CPU computes it"]
    training.warn_if_bf16_is_emulated.cache_clear()


@pytest.mark.parametrize("capability, onednn_isa, computes", [
    ("AVX512", None, True), ("AVX512", "AVX512_CORE_AMX", True), ("AVX512", "avx2", False),
    ("AVX512", "AVX512_CORE_VNNI", False), ("AVX2", None, False), ("DEFAULT", None, False)])
def test_bf16_counts_as_computed_only_where_torch_may_use_the_instructions(monkeypatch, capability, onednn_isa,
                                                                           computes):
    """On a CPU with AVX512-BF16, ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 (docs/usage.md's stand-in for an
    AVX2 laptop) still reported bf16 instructions, so precision `auto` trained in emulated bf16, 18x slower than
    fp32, where the laptop it stands for trains in fp32."""
    monkeypatch.setattr(training.torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(training.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if onednn_isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_isa)
    assert training.cpu_computes_bf16() is computes
    assert training.resolve_precision("auto") == ("bf16-mixed" if computes else "32-true")


def test_the_avx2_stand_in_trains_in_fp32_on_any_cpu():
    """The real check, in a process started with the stand-in's variables: fp32 whatever this CPU is."""
    code = "from pipeline.engine.training import resolve_precision; print(resolve_precision('auto'))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2]).stdout
    assert out.split()[-1] == "32-true"


def test_debug_options_set_the_trainer_arguments_they_name(tmp_path):
    _, fdr = built_trainer(tmp_path, ["+debug=fdr"])
    assert fdr.fast_dev_run is True
    _, limit = built_trainer(tmp_path, ["+debug=limit"])
    assert (limit.limit_train_batches, limit.limit_val_batches) == (5, 2)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):  # after the experiment, over its steps
        cfg = compose(config_name="config", overrides=["+experiment=bert_base", "+debug=limit"])
    assert cfg.pretrain.max_steps == 20
    _, profiled = built_trainer(tmp_path, ["+debug=profiler"])
    assert isinstance(profiled.profiler, SimpleProfiler)


def test_fine_tuning_trainers_run_in_one_process_whatever_the_pretraining_strategy(tmp_path):
    _, trainer = built_trainer(tmp_path, ["trainer=ddp_cpu"], one_process=True)
    assert trainer.num_devices == 1 and type(trainer.strategy).__name__ == "SingleDeviceStrategy"


@pytest.fixture(scope="module")
def bert_data(family_data) -> Path:
    """A root whose tiny BERT run has its data stages done (they ignore the trainer, callbacks and ckpt_path)."""
    return Path(family_data("bert").cfg.paths.cache_dir).parent


def test_callbacks_of_the_callbacks_group_run_in_pretraining(bert_data, tmp_path):
    run = TinyRun(tiny_config(bert_data, [*RESUME_OVERRIDES, "callbacks=[lr_monitor,best_checkpoint]"]))
    out = tmp_path / "bert_pretrain"
    run_stage_into(run, "bert_pretrain", out)
    (metrics,) = out.glob("csv_logs/*/metrics.csv")
    with open(metrics) as f:
        assert any(v for row in csv.DictReader(f) for k, v in row.items() if k.startswith("lr-"))  # LearningRateMonitor
    assert [p.name for p in out.glob("csv_logs/*/checkpoints/best-*.ckpt")]  # the best-loss ModelCheckpoint


def test_fast_dev_run_pretrains_one_step_in_a_cache_entry_of_its_own(bert_data, tmp_path):
    base = TinyRun(tiny_config(bert_data, RESUME_OVERRIDES))
    run = TinyRun(tiny_config(bert_data, [*RESUME_OVERRIDES, "+debug=fdr"]))
    assert run.plan.hashes["bert_pretrain"] != base.plan.hashes["bert_pretrain"]
    out = tmp_path / "bert_pretrain"
    assert run_stage_into(run, "bert_pretrain", out)["steps"] == 1
    assert (out / MARKER).is_file() and (out / "encoder").is_dir()


def test_ckpt_path_starts_pretraining_from_the_given_checkpoint(bert_data, tmp_path):
    """Steps 11-20 from step 10's checkpoint are the steps 11-20 of the run that wrote it: weights, optimizer,
    schedule, data position and RNG all come from the file."""
    first = TinyRun(tiny_config(bert_data, [*RESUME_OVERRIDES, "pretrain.max_steps=20"]))
    first_out = tmp_path / "first"
    run_stage_into(first, "bert_pretrain", first_out)
    given = tmp_path / "given.ckpt"
    given.write_bytes((first_out / "checkpoints" / "step-000010.ckpt").read_bytes())

    started = TinyRun(tiny_config(bert_data, [*RESUME_OVERRIDES, "pretrain.max_steps=20", f"ckpt_path={given}"]))
    assert started.plan.hashes["bert_pretrain"] != first.plan.hashes["bert_pretrain"]
    out = tmp_path / "started"
    summary = run_stage_into(started, "bert_pretrain", out)
    assert summary["resumed_from_step"] == 10 and summary["steps"] == 20
    assert train_losses(out) == train_losses(first_out)

    hash_before = started.plan.hashes["bert_pretrain"]
    given.write_bytes((first_out / "checkpoints" / "step-000020.ckpt").read_bytes())  # other weights, same path
    assert TinyRun(started.cfg).plan.hashes["bert_pretrain"] != hash_before


def test_ckpt_path_with_two_models_pretrained_from_scratch_fails_before_any_work(tmp_path):
    """skip_thought_combine trains uni-skip and bi-skip, each with the `pretrain` settings: one checkpoint cannot start
    both."""
    given = tmp_path / "given.ckpt"
    given.write_bytes(b"")
    with pytest.raises(ValueError, match="ckpt_path.*skip_thought_pretrain, skip_thought_bi_pretrain"):
        validate(tiny_config(tmp_path, [*TINY_FAMILIES["skip_thought"].overrides, f"ckpt_path={given}"],
                             experiment="skip_thought_combine"))


def test_trainer_compile_is_the_pipelines_setting_not_a_trainer_argument(tmp_path):
    """trainer.compile (off by default) adds the callback that compiles the network; it never reaches
    lightning.Trainer, which has no such argument, and a value that is no boolean fails at composition."""
    from hydra.errors import ConfigCompositionException

    from pipeline.engine.training import CompileNetwork, check_trainer_arguments

    cfg, trainer = built_trainer(tmp_path, [])
    assert cfg.trainer.compile is False and not [c for c in trainer.callbacks if isinstance(c, CompileNetwork)]
    cfg, trainer = built_trainer(tmp_path, ["trainer.compile=true"])
    check_trainer_arguments(cfg)
    assert [c for c in trainer.callbacks if isinstance(c, CompileNetwork)]
    with pytest.raises(ValueError, match="trainer.compil: lightning.Trainer takes no argument"):
        check_trainer_arguments(tiny_config(tmp_path, ["+trainer.compil=true"]))
    with pytest.raises(ConfigCompositionException, match="trainer.compile=sometimes"):
        tiny_config(tmp_path, ["trainer.compile=sometimes"])


class _Regression(__import__("lightning").LightningModule):
    """A family's module in miniature: the network it trains is `model`."""

    def __init__(self):
        import torch

        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        self.losses = []

    def training_step(self, batch, batch_idx):
        import torch.nn.functional as F

        loss = F.mse_loss(self.model(batch[0]), batch[1])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        import torch

        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_compile_compiles_the_network_in_place_on_the_cpu(tmp_path):
    """torch.compile of the module's `model` (not the LightningModule), in place: the same parameters and state-dict
    keys (checkpoints and written encoders are unchanged), and the losses of the eager network."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)), batch_size=8)
    runs = {}
    for compiled in (False, True):
        cfg = tiny_config(tmp_path, [f"trainer.compile={str(compiled).lower()}", "trainer.precision=32-true"])
        torch.manual_seed(0)
        module = _Regression()
        keys = list(module.state_dict())
        trainer = make_trainer(StageContext(cfg, "bert_pretrain", tmp_path / f"out{compiled}"), [], max_steps=4)
        trainer.fit(module, data)
        assert (module.model._compiled_call_impl is not None) == compiled
        assert not isinstance(module, torch._dynamo.eval_frame.OptimizedModule)
        assert list(module.state_dict()) == keys
        runs[compiled] = module.losses
    assert runs[True] == pytest.approx(runs[False], rel=1e-5)
    assert isinstance(module, L.LightningModule)


def test_a_gpu_run_pins_the_batches_of_its_train_loader():
    """The families build their loaders without knowing the device; the harness sets pin_memory on a GPU run's
    (pipeline.engine.lightning_loop.pin_batches, called when the run uses CUDA), read as each epoch's iterator
    starts."""
    import warnings

    from torch.utils.data import DataLoader

    from pipeline.engine.lightning_loop import pin_batches

    loader = DataLoader(list(range(6)), batch_size=2)
    assert loader.pin_memory is False
    pin_batches(loader)
    assert loader.pin_memory is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note that without an accelerator nothing is pinned
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    held_out = [{"input_ids": [1]}]
    pin_batches(held_out)  # not a DataLoader: left as it is
    assert held_out == [{"input_ids": [1]}]
