"""Pretraining optimisers: LAMB against a hand computation, the shared groups and schedule, gradient accumulation."""
from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from models.bert import BertForPreTraining, bert_config
from pipeline.bert.module import BertPretrainModule
from pipeline.engine.optim import Lamb, adamw_with_schedule, lamb_with_schedule
from tests.helpers import optimizer_settings


def test_lamb_first_step_by_hand():
    # Step 1 with eps = 0: the bias-corrected Adam direction is g / |g| = sign(g) = (1, -1).
    x = torch.tensor([3.0, 4.0], requires_grad=True)  # ||x|| = 5
    x.grad = torch.tensor([1.0, -2.0])
    Lamb([x], lr=0.01, betas=(0.9, 0.999), eps=0.0, weight_decay=0.1).step()
    u = (1 + 0.1 * 3, -1 + 0.1 * 4)  # sign(g) + weight_decay * x = (1.3, -0.6)
    trust = 5 / math.sqrt(1.3 ** 2 + 0.6 ** 2)
    expected = (3 - 0.01 * trust * u[0], 4 - 0.01 * trust * u[1])
    assert x.detach().tolist() == pytest.approx(expected, rel=1e-6)


def test_lamb_second_step_by_hand():
    b1, b2, lr, eps, wd = 0.9, 0.999, 0.05, 1e-6, 0.01
    x = torch.tensor([3.0, 4.0], requires_grad=True)
    opt = Lamb([x], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    grads = [(1.0, -2.0), (0.5, 0.5)]
    ref = [3.0, 4.0]
    m, v = [0.0, 0.0], [0.0, 0.0]
    for t, g in enumerate(grads, start=1):
        x.grad = torch.tensor(g)
        opt.step()
        m = [b1 * m[i] + (1 - b1) * g[i] for i in range(2)]
        v = [b2 * v[i] + (1 - b2) * g[i] ** 2 for i in range(2)]
        u = [(m[i] / (1 - b1 ** t)) / (math.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * ref[i] for i in range(2)]
        trust = math.hypot(*ref) / math.hypot(*u)
        ref = [ref[i] - lr * trust * u[i] for i in range(2)]
    assert x.detach().tolist() == pytest.approx(ref, rel=1e-5)


def test_lamb_trust_ratio_is_one_for_zero_parameters():
    bias = torch.zeros(2, requires_grad=True)  # zero-initialised, as BERT's biases
    bias.grad = torch.tensor([3.0, -0.5])
    Lamb([bias], lr=0.1, eps=0.0).step()
    assert bias.detach().tolist() == pytest.approx([-0.1, 0.1])


def test_lamb_step_does_not_depend_on_gradient_scale():
    # Why LAMB suits large batches: each layer's step is lr * ||x|| whatever the gradient's magnitude.
    steps = []
    for scale in (1.0, 1000.0):
        torch.manual_seed(0)
        x = torch.randn(4, 4, requires_grad=True)
        start = x.detach().clone()
        x.grad = torch.randn(4, 4) * scale
        Lamb([x], lr=0.01, eps=0.0, weight_decay=0.01).step()
        steps.append(x.detach() - start)
    torch.testing.assert_close(steps[0], steps[1])
    assert steps[0].norm().item() == pytest.approx(0.01 * start.norm().item(), rel=1e-5)


def test_lamb_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="betas"):
        Lamb([torch.zeros(1, requires_grad=True)], betas=(0.9, 1.0))


@pytest.mark.parametrize("make", [adamw_with_schedule, lamb_with_schedule])
def test_groups_and_schedule(make):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    out = make(model, lr=1.0, weight_decay=0.01, betas=(0.9, 0.999), warmup_steps=4, total_steps=12)
    decay, no_decay = out["optimizer"].param_groups
    assert [p.ndim for p in decay["params"]] == [2] and decay["weight_decay"] == 0.01
    assert all(p.ndim == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    scheduler, lrs = out["lr_scheduler"]["scheduler"], []
    for _ in range(13):
        lrs.append(out["optimizer"].param_groups[0]["lr"])
        out["optimizer"].step()
        scheduler.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8, 0.0])


def test_cosine_decay_falls_from_the_peak_to_zero_along_half_a_cosine():
    model = torch.nn.Linear(2, 2)
    out = adamw_with_schedule(model, lr=1.0, weight_decay=0.0, betas=(0.9, 0.999), warmup_steps=2, total_steps=10,
                              decay="cosine")
    factor = out["lr_scheduler"]["scheduler"].lr_lambdas[0]
    remaining = [(10 - step) / 8 for step in range(2, 11)]  # 1 -> 0 after the warmup
    assert [factor(step) for step in range(11)] == pytest.approx(
        [0.5, 1.0, *(0.5 * (1 - math.cos(math.pi * r)) for r in remaining)])
    assert factor(6) == pytest.approx(0.5) and factor(4) == pytest.approx(0.5 + 0.5 * math.sqrt(0.5))
    with pytest.raises(ValueError, match="lr decay 'step' is not known; use one of"):
        adamw_with_schedule(model, 1.0, 0.0, (0.9, 0.999), 2, 10, decay="step")


@pytest.mark.parametrize("family", ["bert", "elmo", "skip_thought", "gpt", "seq2seq"])
def test_every_family_pretrains_with_the_configured_lr_decay(family_data, family):
    """pretrain.lr_decay reaches the optimizer of each family's pretraining stage, as built by the stage itself."""
    from pipeline.engine.dag import StageContext
    from pipeline.stages import STAGES
    from tests.helpers import TINY_FAMILIES

    run = family_data(family)
    name = TINY_FAMILIES[family].pretraining_stage
    cfg = run.cfg.copy()
    cfg.pretrain.lr_decay, cfg.pretrain.warmup_steps, cfg.pretrain.max_steps = "cosine", 2, 10
    task = STAGES[name].fn.keywords["task"]
    module = task.build_module(StageContext(cfg, name, run.stage_dir(name),
                                            {u: run.stage_dir(u) for u in run.plan.stages[name].upstream}),
                               task.settings(cfg))
    factor = module.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]
    assert factor(4) == pytest.approx(0.5 + 0.5 * math.sqrt(0.5))  # linear: 0.75


def _module(optimizer: str = "adamw") -> BertPretrainModule:
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config("bert_tiny", vocab_size=64, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0, max_position_embeddings=16))
    return BertPretrainModule(model, optimizer_settings(1e-3, 1, 10, weight_decay=0.01, optimizer=optimizer))


def test_pretrain_module_picks_the_optimizer():
    assert isinstance(_module("lamb").configure_optimizers()["optimizer"], Lamb)
    assert isinstance(_module("adamw").configure_optimizers()["optimizer"], torch.optim.AdamW)
    with pytest.raises(ValueError, match="lamb"):
        _module("sgd")


def _batch(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(5, 64, (n, 12), generator=g),
            "token_type_ids": torch.zeros(n, 12, dtype=torch.long),
            "attention_mask": torch.ones(n, 12, dtype=torch.long), "mlm_positions": torch.tensor([[1, 4, 7]] * n),
            "mlm_labels": torch.randint(5, 64, (n, 3), generator=g),
            "next_sentence_label": torch.arange(n) % 2}


class _Gradients(L.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads = {n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None}


def _one_optimizer_step(batches: list[dict], accumulate: int) -> tuple[dict, int]:
    grads = _Gradients()
    trainer = L.Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=accumulate, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[grads])
    trainer.fit(_module(), DataLoader(batches, batch_size=None))
    return grads.grads, trainer.global_step


def test_gradient_accumulation_equals_the_large_batch():
    full = _batch(8, seed=1)
    halves = [{k: v[:4] for k, v in full.items()}, {k: v[4:] for k, v in full.items()}]
    large, large_steps = _one_optimizer_step([full], accumulate=1)
    accumulated, accumulated_steps = _one_optimizer_step(halves, accumulate=2)
    assert large_steps == accumulated_steps == 1  # max_steps counts optimizer steps, not batches
    assert large.keys() == accumulated.keys()
    for name in large:
        torch.testing.assert_close(accumulated[name], large[name], rtol=1e-4, atol=1e-6, msg=name)


class _GradientNorms(L.Callback):
    """The global gradient norm before clipping (Lightning clips after on_before_optimizer_step) and the one the
    optimizer stepped with (read by a step post-hook: Lightning's step() runs the closure, i.e. backward and clipping,
    inside it, and the gradients stay until the next zero_grad)."""

    def __init__(self):
        self.unclipped, self.stepped = [], []

    @staticmethod
    def _norm(module) -> float:
        return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters()
                                                     if p.grad is not None])).item()

    def on_train_start(self, trainer, pl_module):
        trainer.optimizers[0].register_step_post_hook(lambda *_: self.stepped.append(self._norm(pl_module)))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.unclipped.append(self._norm(pl_module))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_pretraining_clips_gradients_in_every_precision(precision):
    """The pipeline's setting (trainer precision auto = bf16-mixed on this CPU, pretrain.grad_clip): Lightning's
    mixed-precision plugin refuses to clip for an optimizer that says it unscales gradients itself (fused AdamW)."""
    norms = _GradientNorms()
    trainer = L.Trainer(accelerator="cpu", max_steps=2, precision=precision, gradient_clip_val=1.0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[norms])
    trainer.fit(_module(), DataLoader([_batch(4, seed=1), _batch(4, seed=2)], batch_size=None))
    assert trainer.global_step == 2
    assert min(norms.unclipped) > 4.0  # far above the clip value: a step that did not clip would show it
    assert norms.stepped == pytest.approx([1.0, 1.0], rel=1e-4)


def test_lazy_adamw_on_sparse_rows_equals_adamw_and_leaves_other_rows_alone():
    """Rows 1 and 3 get a gradient at every step: they follow AdamW exactly (dense moments of a row that never
    gets a gradient stay 0, so AdamW would still move it by weight decay alone: rows 0 and 2 must not move)."""
    from pipeline.engine.optim import LazyAdamW

    torch.manual_seed(0)
    start = torch.randn(4, 3)
    sparse_param, dense_param = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start[[1, 3]].clone())
    lazy = LazyAdamW([sparse_param], lr=0.1, weight_decay=0.01)
    reference = torch.optim.AdamW([dense_param], lr=0.1, weight_decay=0.01)
    for step in range(3):
        grad_rows = torch.randn(2, 3)
        # rows listed twice and out of order: the optimizer must sum duplicates (coalesce)
        values = torch.cat([grad_rows[[1, 0]], 0 * grad_rows[1:]])
        sparse_param.grad = torch.sparse_coo_tensor(torch.tensor([[3, 1, 3]]), values, (4, 3))
        dense_param.grad = grad_rows
        lazy.step()
        reference.step()
    torch.testing.assert_close(sparse_param.detach()[[1, 3]], dense_param.detach())
    torch.testing.assert_close(sparse_param.detach()[[0, 2]], start[[0, 2]])


def test_clipping_with_sparse_gradients_equals_clip_grad_norm_on_dense_ones():
    from pipeline.engine.optim import clip_grad_norm_with_sparse

    torch.manual_seed(0)
    table, bias = torch.nn.Parameter(torch.randn(5, 2)), torch.nn.Parameter(torch.randn(2))
    dense_table, dense_bias = torch.nn.Parameter(table.detach().clone()), torch.nn.Parameter(bias.detach().clone())
    ids = torch.tensor([4, 1, 4])
    for emb, b, sparse in ((table, bias, True), (dense_table, dense_bias, False)):
        (torch.nn.functional.embedding(ids, emb, sparse=sparse) * torch.arange(6.0).view(3, 2) + b).sum().backward()
    total = clip_grad_norm_with_sparse([table, bias], 1.0)
    expected = torch.nn.utils.clip_grad_norm_([dense_table, dense_bias], 1.0)
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(table.grad.to_dense(), dense_table.grad)
    torch.testing.assert_close(bias.grad, dense_bias.grad)


def test_a_slower_submodule_trains_at_its_factor_of_the_rate_through_the_schedule():
    from models.bert import BertForSequenceClassification
    from pipeline.engine.optim import adamw_with_schedule

    model = BertForSequenceClassification(bert_config("bert_tiny", vocab_size=64, max_position_embeddings=16), 2)
    out = adamw_with_schedule(model, 1e-3, 0.01, (0.9, 0.999), warmup_steps=1, total_steps=10,
                              lr_scales={id(p): 0.1 for p in model.bert.parameters()})
    optimizer, scheduler = out["optimizer"], out["lr_scheduler"]["scheduler"]
    encoder = {id(p) for p in model.bert.parameters()}
    rates = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            rates[id(param)] = group["lr"]
    assert [rates[i] for i in encoder] == pytest.approx([1e-4] * len(encoder))
    head = [r for i, r in rates.items() if i not in encoder]
    assert head == pytest.approx([1e-3] * len(head)) and len(head) == 2  # the classifier's weight and bias
    assert len(rates) == sum(1 for _ in model.parameters())  # every parameter in exactly one group
    optimizer.step()
    scheduler.step()
    scheduler.step()  # a linear decay scales both rates alike
    assert sorted({round(g["lr"], 12) for g in optimizer.param_groups}) == pytest.approx([1e-4 * 8 / 9,
                                                                                         1e-3 * 8 / 9])


def test_adamw_is_fused_where_torch_has_the_kernel_and_falls_back_where_it_has_not():
    """torch takes fused=True for any parameters and refuses those its fused kernels are not built for only at the
    first step; the pipeline asks for the fused kernel only where it runs, and the fallback computes the same step."""
    from pipeline.engine.optim import LazyAdamW, fused_if_supported

    model = torch.nn.Linear(4, 3)
    assert adamw_with_schedule(model, 1e-3, 0.01, (0.9, 0.999), 1, 10)["optimizer"].defaults["fused"] is True
    on_meta = torch.nn.Parameter(torch.zeros(3, device="meta"))
    on_meta.grad = torch.zeros(3, device="meta")
    with pytest.raises(RuntimeError, match="fused=True"):
        torch.optim.AdamW([on_meta], fused=True).step()
    fallback = fused_if_supported(LazyAdamW, [{"params": [on_meta]}], lr=1e-3)
    assert not fallback.defaults["fused"]
    fallback.step()

    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(5, 7)) for _ in range(2)]
    for w in weights:
        w.grad = torch.randn(5, 7)
    fused = LazyAdamW([weights[0]], lr=1e-2, weight_decay=0.01, fused=True)
    default = LazyAdamW([weights[1]], lr=1e-2, weight_decay=0.01)
    weights[1].data.copy_(weights[0].data)
    weights[1].grad.copy_(weights[0].grad)
    for _ in range(3):
        fused.step()
        default.step()
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-6, atol=1e-6)


def test_bf16_autocast_runs_every_matmul_of_a_training_step_in_bf16():
    """No fp32 cast in the hot path: under bf16 autocast every matrix product of BERT's and GPT's forward and backward
    takes bf16 operands (the losses upcast only the logits they reduce, as autocast itself would)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from models.gpt import GPTLMHeadModel, gpt_config
    from models.kernels import use_fast_kernels
    from pipeline.bert.module import bert_pretraining_losses
    from tests.benchmarks.test_gpu_check import bench_train

    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
               torch.ops.aten.baddbmm.default}

    class Operands(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in matmuls:
                self.dtypes.append((func.__name__, tuple(a.dtype for a in args if isinstance(a, torch.Tensor))))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    bert = use_fast_kernels(BertForPreTraining(bert_config("bert_tiny", vocab_size=512)))  # as the pipeline trains it
    batch = bench_train.make_batch(2, 16)
    batch["input_ids"] %= 512
    batch["mlm_labels"] = torch.where(batch["mlm_labels"] >= 0, batch["mlm_labels"] % 512, batch["mlm_labels"])
    # attention dropout off: with it torch's CPU attention falls back to its math kernel, which computes bf16 inputs in
    # fp32 inside the kernel (not a cast of ours; CUDA's kernels take dropout in bf16)
    gpt = use_fast_kernels(GPTLMHeadModel(gpt_config("gpt_tiny", vocab_size=512, n_positions=32, attn_pdrop=0.0)))
    ids = torch.randint(0, 512, (2, 17))
    steps = {"bert": lambda: bert_pretraining_losses(bert, batch)["loss"],
             "gpt": lambda: gpt(ids[:, :-1], ids[:, 1:]).loss}
    for name, loss_of in steps.items():
        with Operands() as seen:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of()
            loss.backward()
        assert seen.dtypes, name
        assert all(dtypes == (torch.bfloat16,) * len(dtypes) for _, dtypes in seen.dtypes), (name, seen.dtypes)


def test_lazy_adamw_runs_its_step_hooks_once_beside_a_plain_adamw():
    """torch wraps a class's step in its hook runner when the first instance is made; once a plain AdamW existed,
    LazyAdamW's call of AdamW's step ran every step hook twice (found when gpu_check's tests made one first)."""
    from pipeline.engine.optim import LazyAdamW

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.ones(3)
    optimizer, calls = LazyAdamW([param], lr=0.1), []
    optimizer.register_step_post_hook(lambda *_: calls.append("post"))
    optimizer.register_step_pre_hook(lambda *_: calls.append("pre"))
    optimizer.step()
    assert calls == ["pre", "post"]
    assert param.detach().tolist() == pytest.approx([-0.1] * 3)  # the step itself ran, once


def _stage_module(run, stage: str, **settings):
    """The pretraining module `stage` builds itself, from the run's config with `settings` set in `pretrain`."""
    from pipeline.engine.dag import StageContext
    from pipeline.stages import STAGES

    cfg = run.cfg.copy()
    for key, value in settings.items():
        cfg.pretrain[key] = value
    task = STAGES[stage].fn.keywords["task"]
    return task.build_module(StageContext(cfg, stage, run.stage_dir(stage),
                                          {u: run.stage_dir(u) for u in run.plan.stages[stage].upstream}),
                             task.settings(cfg))


def test_bert_pretrains_with_the_optimizer_groups_and_schedule_it_always_had(family_data):
    """What `make run`'s BERT numbers rest on, pinned: fused LazyAdamW at pretrain.lr and pretrain.betas with torch's
    eps, weight decay on every trained matrix and embedding and on nothing else, in parameter order, and a linear warmup
    then a linear decay to 0 at pretrain.max_steps."""
    from pipeline.engine.optim import LazyAdamW

    run = family_data("bert")
    p = run.cfg.pretrain
    module = _stage_module(run, "bert_pretrain")
    out = module.configure_optimizers()
    optimizer = out["optimizer"]
    assert type(optimizer) is LazyAdamW
    assert optimizer.defaults == {"lr": p.lr, "betas": tuple(p.betas), "eps": 1e-8, "weight_decay": 0.01,
                                  "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                                  "differentiable": False, "fused": True, "decoupled_weight_decay": True}
    trained = [t for t in module.model.parameters() if t.requires_grad]
    assert [([id(t) for t in g["params"]], g["weight_decay"], g["initial_lr"]) for g in optimizer.param_groups] == [
        ([id(t) for t in trained if t.ndim >= 2], p.weight_decay, p.lr),
        ([id(t) for t in trained if t.ndim < 2], 0.0, p.lr)]
    assert out["lr_scheduler"]["interval"] == "step"
    factor = out["lr_scheduler"]["scheduler"].lr_lambdas[0]
    warmup, total = p.warmup_steps, p.max_steps
    assert [factor(s) for s in range(total + 1)] == pytest.approx(
        [(s + 1) / warmup if s < warmup else (total - s) / (total - warmup) for s in range(total + 1)])
