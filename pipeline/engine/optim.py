"""The optimisers and schedules every family trains with: AdamW without decay on biases and LayerNorm and a linear
warmup, then a linear (BERT §A.2) or cosine (Loshchilov & Hutter 2017, without restarts) decay; the Transformer's
inverse-square-root schedule (noam_rate); LazyAdamW for sparse gradients (ELMo's sampled softmax), LAMB for large
batches."""
from __future__ import annotations

import math

import torch
from torch import nn

from pipeline.schema import LR_DECAYS, PretrainOptimizer

# the attribute freeze_rows sets on a parameter: the ids of the rows that stay as they are
FROZEN_ROWS = "frozen_rows"


def freeze_rows(weight: nn.Parameter, rows: torch.Tensor) -> None:
    """Keep rows `rows` (ids) of `weight` as they are while the others train: a gradient hook zeroes their gradient
    (every backward pass; a tied output layer's share included, as both read this one parameter), so Adam's moments
    and update for them stay exactly 0 and gradient clipping does not count them, and _decay_groups leaves a parameter
    so marked out of weight decay, which would shrink rows of zero gradient too."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    setattr(weight, FROZEN_ROWS, rows)
    weight.register_hook(lambda grad: grad.index_fill(0, rows.to(grad.device), 0))


def _decay_groups(module: nn.Module, weight_decay: float, lr: float | None = None,
                  lr_scales: dict[int, float] | None = None) -> list[dict]:
    """Parameter groups: weight decay on weight matrices and embeddings, none on biases and LayerNorm (BERT §A.2), nor
    on an embedding table some of whose rows are frozen (freeze_rows: decay would move them; its other rows go
    without decay, a small change beside the 0.01 of the others).
    `lr_scales` (id(parameter) -> factor): those parameters at factor x `lr`, in groups of their own (a pretrained
    encoder under a fresh task head: Howard & Ruder 2018's discriminative fine-tuning; one factor per layer: layer-wise
    decay); the others at `lr`."""
    lr_scales = lr_scales or {}
    trained = [p for p in module.parameters() if p.requires_grad]
    groups = []
    for scale in dict.fromkeys([1.0, *(lr_scales.get(id(p), 1.0) for p in trained)]):
        params = [p for p in trained if lr_scales.get(id(p), 1.0) == scale]
        extra = {} if scale == 1.0 else {"lr": lr * scale}
        groups += [group for group in (
            {"params": [p for p in params if _decays(p)], "weight_decay": weight_decay, **extra},
            {"params": [p for p in params if not _decays(p)], "weight_decay": 0.0, **extra}) if group["params"] or
            scale == 1.0]
    return groups


def _decays(parameter: nn.Parameter) -> bool:
    return parameter.ndim >= 2 and not hasattr(parameter, FROZEN_ROWS)


def _with_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                   decay: str = "linear") -> dict:
    """Lightning's optimizer dict: linear warmup to the peak lr over `warmup_steps`, then `decay` (LR_DECAYS) to 0 at
    `total_steps`, stepped once per optimizer step (not per batch, so gradient accumulation keeps the schedule).
    noam: noam_rate's shape scaled so that its peak, at the end of the warmup, is the optimizer's lr: pretrain.lr
    is then seed 000's factor / sqrt(d_model * warmup), the same setting for every family whatever its width."""
    if decay not in LR_DECAYS:
        raise ValueError(f"lr decay {decay!r} is not known; use one of {list(LR_DECAYS)}")
    warmup_steps = max(1, warmup_steps)

    def factor(step: int) -> float:
        if decay == "noam":  # LambdaLR's step 0 is the first update's, seed 000's step 1
            return noam_rate(step + 1, 1, warmup_steps) / noam_rate(warmup_steps, 1, warmup_steps)
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        remaining = max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))  # 1 -> 0
        return remaining if decay == "linear" else 0.5 * (1.0 - math.cos(math.pi * remaining))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The learning rate of Vaswani et al. 2017 (eq. 3; seed 000's rate()): factor * d_model^-0.5 * min(step^-0.5,
    step * warmup^-1.5), a linear rise over `warmup` steps to factor / sqrt(d_model * warmup), then a decay as
    1 / sqrt(step). Step 0 counts as step 1, as in seed 000 (LambdaLR asks for step 0 before the first update)."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def noam_schedule(optimizer: torch.optim.Optimizer, d_model: int, warmup: int,
                  factor: float = 1.0) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR stepping `optimizer` along noam_rate, once per optimizer step: its lr is the optimizer's own lr times
    the rate, so give the optimizer lr=1 for the rate itself (seed 000: Adam(lr=1, betas=(0.9, 0.98), eps=1e-9))."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: noam_rate(step, d_model, warmup, factor))


def _adam_direction(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, grad: torch.Tensor, betas, eps: float,
                    step: float) -> torch.Tensor:
    """Adam's moment updates, in place, and its bias-corrected direction m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps)
    (Kingma & Ba 2015, Algorithm 1); shared by LAMB and LazyAdamW's sparse rows."""
    beta1, beta2 = betas
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return (exp_avg / (1 - beta1 ** step)) / (exp_avg_sq / (1 - beta2 ** step)).sqrt_().add_(eps)


class LazyAdamW(torch.optim.AdamW):
    """AdamW that also takes sparse gradients (ELMo's sampled softmax gathers N + K rows of a 793k x 512 matrix):
    for those, only the rows present get their moments and values updated, as in TF's LazyAdam and torch's
    SparseAdam, with the bias correction of the parameter's step count and decoupled weight decay on those rows.
    Dense gradients get torch's AdamW unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # fused=True sets this, telling a GradScaler (and Lightning) that step() unscales gradients itself; then
        # Lightning refuses gradient clipping, which needs them unscaled before the step. False: unscale first,
        # as for any optimizer; the fused kernel runs the same with no scale to apply.
        self._step_supports_amp_scaling = False

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # Lightning's closure runs forward and backward: the gradients exist only after it
            with torch.enable_grad():
                loss = closure()
        stashed = {}
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None and param.grad.is_sparse:
                    self._sparse_step(group, param)
                    stashed[param], param.grad = param.grad, None
        adamw_step = torch.optim.AdamW.step
        # AdamW's step without the hook wrapper torch puts on AdamW.step once a plain AdamW exists in the process: the
        # step hooks (Lightning's and the tests' post-step hooks) already run around this step, and would run twice
        (adamw_step.__wrapped__ if getattr(adamw_step, "hooked", False) else adamw_step)(self)
        for param, grad in stashed.items():
            param.grad = grad
        return loss

    def _sparse_step(self, group: dict, param: torch.Tensor) -> None:
        grad = param.grad.coalesce()
        rows, values = grad.indices()[0], grad.values()
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        state["step"] += 1
        exp_avg, exp_avg_sq = state["exp_avg"][rows], state["exp_avg_sq"][rows]  # copies of the rows present
        update = _adam_direction(exp_avg, exp_avg_sq, values, group["betas"], group["eps"], float(state["step"]))
        state["exp_avg"][rows], state["exp_avg_sq"][rows] = exp_avg, exp_avg_sq
        lr = group["lr"]
        param[rows] = param[rows].mul_(1 - lr * group["weight_decay"]).sub_(update, alpha=lr)


def clip_grad_norm_with_sparse(parameters, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for gradients of which some are sparse (which it refuses): the global L2
    norm over all gradients, sparse ones coalesced first so that repeated rows count once, summed."""
    grads = []
    for param in parameters:
        if param.grad is not None:
            if param.grad.is_sparse:
                param.grad = param.grad.coalesce()
            grads.append(param.grad)
    norms = [(g.values() if g.is_sparse else g).float().norm() for g in grads]
    total = torch.stack(norms).norm() if norms else torch.tensor(0.0)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        (g.values() if g.is_sparse else g).mul_(scale.to(g.dtype))
    return total


def adamw_with_schedule(module: nn.Module, lr: float, weight_decay: float, betas, warmup_steps: int,
                        total_steps: int, lr_scales: dict[int, float] | None = None, decay: str = "linear"):
    """AdamW without decay on biases and LayerNorm weights, linear warmup then `decay` to 0 (_with_schedule).
    LazyAdamW, which is AdamW for dense gradients, so that sparse ones (ELMo's sampled softmax) are taken too.
    `lr_scales`: id(parameter) -> factor of lr (_decay_groups)."""
    optimizer = fused_if_supported(LazyAdamW, _decay_groups(module, weight_decay, lr, lr_scales), lr=lr,
                                   betas=tuple(betas))
    return _with_schedule(optimizer, warmup_steps, total_steps, decay)


def fused_if_supported(optimizer_class: type[torch.optim.Optimizer], param_groups: list[dict],
                       **kwargs) -> torch.optim.Optimizer:
    """`optimizer_class(param_groups, fused=True, **kwargs)`: torch's fused Adam/AdamW kernel, one kernel over all
    tensors instead of a Python loop of ~10 ops per tensor (0.3-0.5 s -> 0.05-0.09 s per step at bert_base on this
    project's CPU, ~5 % of the step; on CUDA the kernel nanoGPT trains with). Where torch has no fused kernel for a
    parameter's device or dtype, the default implementation, which computes the same update: torch accepts fused=True
    for any parameters and refuses them only at the first step."""
    return optimizer_class(param_groups, fused=fused_kernel_supports(param_groups) or None, **kwargs)


def fused_kernel_supports(param_groups: list[dict]) -> bool:
    """Whether torch's fused optimizer kernels take every parameter: floating point, on a device they are built for
    (the list torch itself checks at the first step: CPU and CUDA among them, not e.g. `meta`)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = _get_fused_kernels_supported_devices()
    return all(p.device.type in devices and torch.is_floating_point(p)
               for group in param_groups for p in group["params"])


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2): Adam's bias-corrected
    direction plus decoupled weight decay, rescaled per parameter tensor by the trust ratio ||x|| / ||update||, so
    every layer moves by about lr times its own norm however large the batch (and so the gradient) is.

    Per tensor x with gradient g at step t:
        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * x
        x = x - lr * (||x|| / ||u||) * u      (trust ratio 1 where ||x|| or ||u|| is 0, e.g. zero-init biases)
    The paper's scaling function phi is the identity here, as in its experiments; layers without weight decay are
    adapted too (the paper applies the ratio to every layer).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Lamb needs lr, eps, weight_decay >= 0 and betas in [0, 1); got lr={lr}, eps={eps}, "
                             f"weight_decay={weight_decay}, betas={tuple(betas)}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for x in group["params"]:
                if x.grad is None:
                    continue
                if x.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients; use dense embeddings")
                state = self.state[x]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(x, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(x, memory_format=torch.preserve_format)
                state["step"] += 1
                update = _adam_direction(state["exp_avg"], state["exp_avg_sq"], x.grad, group["betas"], group["eps"],
                                         state["step"])
                if group["weight_decay"]:
                    update.add_(x, alpha=group["weight_decay"])
                x_norm, u_norm = x.norm(), update.norm()
                trust = torch.where((x_norm > 0) & (u_norm > 0), x_norm / u_norm, torch.ones_like(x_norm))
                x.add_(update * trust, alpha=-group["lr"])
        return loss


def lamb_with_schedule(module: nn.Module, lr: float, weight_decay: float, betas, warmup_steps: int,
                       total_steps: int, decay: str = "linear"):
    """LAMB with the same parameter groups and schedule as adamw_with_schedule (You et al. §4: BERT with
    batches up to 64k)."""
    optimizer = Lamb(_decay_groups(module, weight_decay), lr=lr, betas=tuple(betas))
    return _with_schedule(optimizer, warmup_steps, total_steps, decay)


# pretrain.optimizer: the function that builds it, with its parameter groups and schedule
PRETRAIN_OPTIMIZERS = {PretrainOptimizer.adamw.value: adamw_with_schedule,
                       PretrainOptimizer.lamb.value: lamb_with_schedule}
# Those that take sparse gradients (LazyAdamW); with another, a model's sparse gradients are made dense
# (use_dense_gradients): LAMB's trust ratio is a norm over the whole tensor, every row of it
TAKE_SPARSE_GRADIENTS = ("adamw",)


def sparse_gradient_parameters(module: nn.Module) -> list[str]:
    """Names of the parameters with a sparse gradient: the `weight` of each submodule flagged `sparse`, as
    nn.Embedding's flag means (and ELMo's SharedSoftmax's)."""
    return [f"{prefix}.weight" if prefix else "weight" for prefix, sub in module.named_modules()
            if getattr(sub, "sparse", False)]


def use_dense_gradients(module: nn.Module, why: str) -> None:
    """Every parameter of `module` gets a dense gradient (same values, more memory), for a trainer or optimizer that
    cannot take sparse ones (`why`, said on the console where it changes anything)."""
    if names := sparse_gradient_parameters(module):
        print(f"dense gradients for {', '.join(names)}: {why}", flush=True)
    for sub in module.modules():
        if getattr(sub, "sparse", False):
            sub.sparse = False
