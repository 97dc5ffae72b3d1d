"""The GPU check's arithmetic: model FLOPs of a training step, the GPUs' published peaks, MFU.

Model FLOPs are counted as PaLM's appendix B counts them (Chowdhery et al. 2022): per token 6 x the weights of the
matmuls the token goes through, plus 12 L H Q T for attention (L layers, H heads of width Q, sequence T; the full
T x T, also for a causal model, as PaLM and nanoGPT count it). Work a model does beyond that (HF's MLM head over every
position instead of the masked ones) is not counted: it shows up as time. MFU is model FLOPs per second over the GPU's
dense bf16 peak from PEAK_BF16_TFLOPS (its datasheet); "of matmul peak" is over the bf16 matmul throughput measured
in the same run. The element-wise work of the recurrent families (ELMo, Skip-Thought) is not counted either.
"""
from __future__ import annotations

import re

# Dense bf16 tensor-core peaks in TFLOP/s, matched in order against torch.cuda.get_device_name() (an H100 SXM5 reports
# "NVIDIA H100 80GB HBM3"). NVIDIA's datasheets print these "with sparsity", i.e. doubled; the figures here are half of
# those (docs/gpu.md cites each). Parts with lower clocks (the NVL boards) are not listed, rather than given another
# part's peak: pass --peak-tflops for them.
PEAK_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"H100.*PCIe", 756.0, "NVIDIA H100 datasheet, PCIe: 1,513 TFLOPS bf16 with sparsity"),
    (r"(GH200|H100|H200)(?!.*NVL)", 989.4, "NVIDIA H100/H200 datasheets, SXM: 1,979 TFLOPS bf16 with sparsity"),
    (r"A100", 312.0, "NVIDIA A100 datasheet: 312 TFLOPS bf16 (624 with sparsity), SXM and PCIe"),
    (r"L40S", 362.05, "NVIDIA L40S datasheet: 362.05 TFLOPS bf16 (733 with sparsity)"),
    (r"L4\b", 121.0, "NVIDIA L4 datasheet: 242 TFLOPS bf16 with sparsity"),
    (r"B200", 2250.0, "NVIDIA HGX B200 datasheet: 4.5 PFLOPS bf16 per GPU with sparsity"),
)


def bert_step_flops(layers: int, hidden: int, intermediate: int, vocab: int, batch: int, seq: int,
                    masked: int) -> int:
    """Model FLOPs of one BERT pretraining step (forward + backward): per token 6 x the encoder's matmul weights
    (Q, K, V and output projections 4H^2, feed-forward 2HI) + 12 L H T for attention; the MLM head (transform H^2 and
    tied decoder HV) at the `masked` positions only, which is all the task needs; pooler and NSP (H^2 + 2H) per
    sequence. The same count as benchmarks/bench_train.py's step_flops."""
    tokens = batch * seq
    return (6 * tokens * layers * (4 * hidden * hidden + 2 * hidden * intermediate)
            + 12 * tokens * layers * hidden * seq
            + 6 * masked * (hidden * hidden + hidden * vocab)
            + 6 * batch * (hidden * hidden + 2 * hidden))


def gpt_step_flops(layers: int, hidden: int, vocab: int, batch: int, seq: int) -> int:
    """Model FLOPs of one GPT training step: per token 6 x (12 L H^2 block weights + H V for the tied LM head)
    + 12 L H T for attention over the full T (PaLM's and nanoGPT's estimate_mfu count)."""
    tokens = batch * seq
    return 6 * tokens * (12 * layers * hidden * hidden + hidden * vocab) + 12 * tokens * layers * hidden * seq


def peak_bf16_tflops(device_name: str) -> tuple[float, str] | None:
    """(dense bf16 TFLOP/s, source) of the first PEAK_BF16_TFLOPS entry matching the device name, or None."""
    for pattern, tflops, source in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return tflops, source
    return None


def mfu(flops_per_step: float, seconds_per_step: float, peak_tflops: float) -> float:
    return flops_per_step / seconds_per_step / (peak_tflops * 1e12)
