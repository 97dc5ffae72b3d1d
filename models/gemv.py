"""F.linear for the few rows of a decoding step, by a kernel of our own (models/gemv.cpp) where it is faster.

A decoding step multiplies one row per sequence by every weight of the model: 2 flops per weight read, so its speed
is the speed at which the weights stream from memory. MKL runs a one-row product on one thread, well below the
machine's rate; models/gemv.cpp splits the weight's rows between the intra-op threads and reads each once, at the rate
of a plain sum over the same matrix (docs/gpt.md has the table). models/kernels.py's DecodingLinear uses it.

The kernel is compiled on first use (~40 s, once per machine: torch.utils.cpp_extension keeps it under
TORCH_EXTENSIONS_DIR) for x86 CPUs with AVX2 and FMA, as DeepSpeed builds its CPU ops. Where it cannot run (another
CPU, no compiler, a build that fails) `linear` is F.linear, with one warning saying why.
"""

import contextlib
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

# Rows a decoding step multiplies: one per sequence (greedy or sampling at batch 1, a handful of beams or samples).
# Up to here the kernel is well ahead of MKL; the two meet near 128 rows (docs/kernels.md). Larger inputs (prompts,
# training) stay with the library.
MAX_ROWS = 16

_SOURCE = Path(__file__).with_name("gemv.cpp")
_CPUS = ("AVX2", "AVX512")  # torch.backends.cpu.get_cpu_capability(): the instruction sets gemv.cpp is built for
_kernel = None  # the built extension, or False once it could not be built or loaded


def kernel():
    """The compiled models/gemv.cpp, built on the first call; None where it cannot run (warned once)."""
    global _kernel
    if _kernel is None:
        _kernel = _build()
    return _kernel or None


def _build():
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in _CPUS:
        warnings.warn(f"decoding uses F.linear: models/gemv.cpp needs an x86 CPU with AVX2, this one reports "
                      f"{capability}", stacklevel=3)
        return False
    from torch.utils.cpp_extension import get_default_build_root, load

    print("decoding: loading models/gemv.cpp (compiled once per machine: ~40 s the first time)", flush=True)
    try:
        # where torch.utils.cpp_extension would build it: TORCH_EXTENSIONS_DIR (the Makefile sets it), else its default
        build_dir = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / "textrep_gemv"
        build_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_lock(build_dir / "lock")
        with _ninja_on_path():
            return load(name="textrep_gemv", sources=[str(_SOURCE)],
                        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"],
                        build_directory=str(build_dir))
    except Exception as error:  # a missing compiler or ninja, a failed build: decoding still works, more slowly
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"decoding uses F.linear: models/gemv.cpp did not build ({first_line}); install a C++ "
                      "compiler (g++) and ninja for faster decoding", stacklevel=3)
        return False


@contextlib.contextmanager
def _ninja_on_path():
    """torch builds with the `ninja` on PATH. The pip package (a dependency of DeepSpeed) puts one beside this Python,
    which is not on PATH when the venv's Python is run without activating the venv (as `make` does)."""
    beside_python = Path(sys.executable).parent
    if shutil.which("ninja") or not (beside_python / "ninja").is_file():
        yield
        return
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{beside_python}{os.pathsep}{path}"
    try:
        yield
    finally:
        os.environ["PATH"] = path


# A build takes ~40 s. torch's build lock is a file that a killed build leaves behind, and every later build waits on
# it forever: one this old is such a leftover.
STALE_LOCK_SECONDS = 600


def _remove_stale_lock(lock: Path) -> None:
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        warnings.warn(f"removing {lock}, left {age / 60:.0f} min ago by a build of models/gemv.cpp that did not "
                      "finish", stacklevel=4)
        lock.unlink(missing_ok=True)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): x (..., in), weight (out, in) -> (..., out). By the kernel for at most MAX_ROWS rows
    of fp32 on the CPU outside autograd (a decoding step), else by F.linear."""
    rows = x.numel() // max(1, x.size(-1))
    if (rows > MAX_ROWS or x.device.type != "cpu" or weight.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32
            or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)))
            or x.size(-1) != weight.size(-1) or not weight.is_contiguous() or kernel() is None):
        return F.linear(x, weight, bias)
    bias = weight.new_empty(0) if bias is None else bias.contiguous()  # the kernel reads an empty bias as none
    y = _kernel.linear_rows(x.reshape(rows, -1).contiguous(), weight, bias)
    return y.view(*x.shape[:-1], weight.size(0))
