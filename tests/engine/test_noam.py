"""The Transformer's learning-rate schedule (Vaswani et al. 2017 eq. 3, seed 000's rate()): pipeline/optim.py's
noam_rate against hand-computed values, and noam_schedule stepping an optimizer along it."""
from __future__ import annotations

import copy

import pytest
import torch

from pipeline.engine.optim import noam_rate, noam_schedule


def test_noam_rate_by_hand():
    """Vaswani et al.'s base model (d_model 512, 4000 warm-up steps): the peak at step 4000 is 1 / sqrt(512 * 4000)
    = 1 / 1431.08; halfway up (step 2000) and at 4 x the warm-up (step 16000, 1 / sqrt(512 * 16000) = 1 / 2862.17) it
    is half of that; step 0 counts as step 1: 1 / (22.627 * 4000^1.5) = 1 / (22.627 * 252982)."""
    assert noam_rate(4000, 512, 4000) == pytest.approx(1 / 1431.08, rel=1e-5)
    assert noam_rate(2000, 512, 4000) == pytest.approx(0.5 / 1431.08, rel=1e-5)
    assert noam_rate(16000, 512, 4000) == pytest.approx(1 / 2862.17, rel=1e-5)
    assert noam_rate(0, 512, 4000) == noam_rate(1, 512, 4000) == pytest.approx(1 / (22.627 * 252982), rel=1e-4)
    assert noam_rate(4000, 512, 4000, factor=2.0) == pytest.approx(2 / 1431.08, rel=1e-5)
    assert noam_rate(3999, 512, 4000) < noam_rate(4000, 512, 4000) > noam_rate(4001, 512, 4000)


def test_noam_schedule_steps_the_optimizer_along_the_rate():
    x = torch.zeros(2, requires_grad=True)
    optimizer = torch.optim.Adam([x], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = noam_schedule(optimizer, d_model=128, warmup=10, factor=0.5)
    for step in range(30):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(noam_rate(step, 128, 10, 0.5))
        optimizer.step()
        scheduler.step()


def test_the_engines_noam_decay_peaks_at_lr_after_the_warmup_and_falls_as_one_over_sqrt_step():
    """pretrain.lr_decay=noam: noam_rate's shape scaled so that lr is its peak; LambdaLR's step s is seed 000's s+1."""
    from pipeline.engine.optim import adamw_with_schedule

    factor = adamw_with_schedule(torch.nn.Linear(2, 2), 1.0, 0.0, (0.9, 0.98), 10, 100,
                                 decay="noam")["lr_scheduler"]["scheduler"].lr_lambdas[0]
    assert factor(9) == pytest.approx(1.0) and factor(4) == pytest.approx(0.5)
    assert factor(39) == pytest.approx(0.5) and factor(1000) > 0  # 4 x the warmup: half; never 0 at max_steps
    assert [factor(s) / factor(9) for s in (0, 9, 39)] == pytest.approx(
        [noam_rate(s + 1, 512, 10) / noam_rate(10, 512, 10) for s in (0, 9, 39)])


@pytest.mark.parametrize("family", ["gpt", "seq2seq"])
def test_pretrain_lr_decay_noam_reaches_a_familys_optimizer(family_data, family):
    """Any family's pretraining stage builds its schedule from pretrain.lr_decay=noam: the engine's, not a family's."""
    from pipeline.engine.dag import StageContext
    from pipeline.stages import STAGES
    from tests.helpers import TINY_FAMILIES

    run = family_data(family)
    name = TINY_FAMILIES[family].pretraining_stage
    cfg = copy.deepcopy(run.cfg)  # DictConfig.copy is shallow: the session's run would keep these settings
    cfg.pretrain.lr_decay, cfg.pretrain.warmup_steps, cfg.pretrain.max_steps = "noam", 4, 10
    task = STAGES[name].fn.keywords["task"]
    module = task.build_module(StageContext(cfg, name, run.stage_dir(name),
                                            {u: run.stage_dir(u) for u in run.plan.stages[name].upstream}),
                               task.settings(cfg))
    factor = module.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]
    assert factor(3) == pytest.approx(1.0) and factor(15) == pytest.approx(0.5) and factor(10) > 0
