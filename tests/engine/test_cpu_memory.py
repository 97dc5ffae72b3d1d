import statistics
import subprocess
import sys

import pytest

# Trains a BERT-decoder-sized linear layer (a 94 MB weight, V=30522 x H=768) and prints the page faults of each step.
STEPS = """
import resource, sys, torch
from pipeline.engine.training import keep_freed_memory_for_reuse
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    assert keep_freed_memory_for_reuse()
layer, x = torch.nn.Linear(768, 30522, bias=False), torch.randn(160, 768)
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    layer(x).square().mean().backward()
    layer.weight.grad = None
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def median_faults_per_step_after_warmup(mode: str) -> int:
    """The median, not every step: glibc now and then grows or trims the heap in a step of either mode."""
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return int(statistics.median_high(int(n) for n in out.stdout.split()[4:]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_training_steps_reuse_freed_memory_instead_of_faulting_it_back_in():
    # By default the 94 MB weight gradient is a fresh mmap nearly every step: >= 23k faults of 4 KiB pages. (CI once saw
    # one step of 12 fault nothing, so the median is asked here too.)
    assert median_faults_per_step_after_warmup("default") > 10_000
    # Kept: the freed blocks are reused. glibc may still grow the heap now and then while aligned blocks settle: on the
    # AMX Xeon two of the 4 steps after the warm-up once faulted (4.8k-17k pages), so the median of 12 is asked.
    assert median_faults_per_step_after_warmup("keep") < 1_000


# Training steps whose row count changes every step (as BERT's packed real tokens do): a linear layer and GELU,
# forward and backward. Prints the RSS (MB) after step 50 and after step 150.
CHANGING_SHAPES = """
import sys, psutil, torch
from pipeline.engine.training import RELEASE_EVERY_N_BATCHES, keep_freed_memory_for_reuse, release_freed_memory
torch.set_num_threads(1)
assert keep_freed_memory_for_reuse()
torch.manual_seed(0)
layer = torch.nn.Linear(64, 256)
for step in range(1, 151):
    x = torch.randn(1000 + 9 * step, 64)
    torch.nn.functional.gelu(layer(x)).backward(torch.ones(1000 + 9 * step, 256))
    layer.weight.grad = layer.bias.grad = None
    if sys.argv[1] == "release" and step % RELEASE_EVERY_N_BATCHES == 0:
        release_freed_memory()
    if step in (50, 150):
        print(psutil.Process().memory_info().rss / 2**20)
"""


def rss_after_steps_50_and_150(mode: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", CHANGING_SHAPES, mode], capture_output=True, text=True, check=True)
    at_50, at_150 = map(float, out.stdout.split())
    return at_50, at_150


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_releasing_freed_memory_keeps_training_with_changing_shapes_flat():
    # The heap keeps the freed blocks of every new size, pinned by small allocations between them (oneDNN's per-shape
    # kernels): ~1.5 MB per step here, ~4.5 MB per step for bert_tiny's pretraining (docs/reliability.md).
    kept_50, kept_150 = rss_after_steps_50_and_150("keep_only")
    assert kept_150 - kept_50 > 100
    released_50, released_150 = rss_after_steps_50_and_150("release")
    assert released_150 - released_50 < 20


def test_every_trainer_releases_freed_memory_every_50_batches_and_after_validation(tmp_path, monkeypatch):
    from pipeline.engine import training
    from tests.engine.test_trainer_config import built_trainer

    calls = []
    monkeypatch.setattr(training, "release_freed_memory", lambda: calls.append(1))
    _, trainer = built_trainer(tmp_path, [])
    [release] = [c for c in trainer.callbacks if isinstance(c, training.ReleaseFreedMemory)]
    for batch in range(120):
        release.on_train_batch_end(trainer, None, None, None, batch)
    assert len(calls) == 2
    release.on_validation_end(trainer, None)
    assert len(calls) == 3


def test_the_memory_benchmark_measures_what_stays_after_each_release_not_the_sawtooth():
    """bert_tiny at batch 128 climbed ~60 MB a step between releases and fell back to the same ~680 MB after each:
    a slope over every sample called that +3.8 MB per step, or -1.2 where a run stopped just after a release."""
    from benchmarks.bench_memory import retained_growth_per_step

    sawtooth = [(step, 680 + 0.08 * step + (step % 50) * 60.0) for step in range(10, 310, 10)]
    assert retained_growth_per_step(sawtooth, warmup=66, release_every=50) == pytest.approx(0.08)
    leaking = [(step, 680 + 4.5 * step + (step % 50) * 60.0) for step in range(10, 310, 10)]
    assert retained_growth_per_step(leaking, warmup=66, release_every=50) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="run more --steps"):
        retained_growth_per_step(sawtooth[:12], warmup=66, release_every=50)
