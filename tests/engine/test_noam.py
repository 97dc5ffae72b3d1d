"""The Transformer's learning-rate schedule (Vaswani et al. 2017 eq. 3, seed 000's rate()): pipeline/optim.py's
noam_rate against hand-computed values, and noam_schedule stepping an optimizer along it."""
from __future__ import annotations

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
