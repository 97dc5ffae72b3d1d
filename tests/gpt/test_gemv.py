"""models/gemv.py: the few-row products of a decoding step, by models/gemv.cpp where it runs, else F.linear."""
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

from models import gemv

BUILDABLE = torch.backends.cpu.get_cpu_capability() in gemv._CPUS and shutil.which("g++") is not None


@pytest.mark.skipif(not BUILDABLE, reason="models/gemv.cpp is built for x86 CPUs with AVX2, with g++")
def test_the_kernel_builds_where_it_should():
    """On an AVX2 CPU with a compiler a broken gemv.cpp must fail here, not fall back to F.linear unnoticed."""
    assert gemv.kernel() is not None


# rows, in, out: one row and a few (beams); widths that are not multiples of the kernel's 8 lanes and 4-row blocks;
# gpt_small's shrinking MLP projection.
SHAPES = [(1, 8, 24), (1, 24, 8), (3, 13, 7), (16, 37, 130), (1, 3072, 768), (2, 1, 5)]


@pytest.mark.parametrize("rows,n_in,n_out", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_is_f_linear(rows, n_in, n_out, with_bias):
    torch.manual_seed(0)
    x, weight = torch.randn(rows, n_in), torch.randn(n_out, n_in)
    bias = torch.randn(n_out) if with_bias else None
    with torch.no_grad():
        y = gemv.linear(x, weight, bias)
    assert y.shape == (rows, n_out)
    # fp32 sums in another order: a few ulps of the sum's magnitude (~sqrt(n_in) for these values)
    torch.testing.assert_close(y, F.linear(x, weight, bias), atol=1e-5 * n_in ** 0.5, rtol=1e-5)


def test_linear_keeps_leading_dimensions_and_reads_views():
    torch.manual_seed(0)
    states = torch.randn(2, 5, 16)  # (B, T, C): the last position of each row is a strided view
    weight, bias = torch.randn(24, 16), torch.randn(24)
    with torch.no_grad():
        torch.testing.assert_close(gemv.linear(states[:, -1], weight, bias), F.linear(states[:, -1], weight, bias),
                                   atol=1e-5, rtol=1e-5)
        assert gemv.linear(states[:, -1:], weight, bias).shape == (2, 1, 24)


class Refusing:
    @staticmethod
    def linear_rows(*args):
        raise AssertionError("the kernel was called")


@pytest.mark.parametrize("case", ["too many rows", "autograd", "bf16", "strided weight"])
def test_what_is_not_a_decoding_step_goes_to_f_linear(monkeypatch, case):
    monkeypatch.setattr(gemv, "_kernel", Refusing)
    torch.manual_seed(0)
    weight = torch.randn(6, 4, requires_grad=case == "autograd")
    x = torch.randn(gemv.MAX_ROWS + 1 if case == "too many rows" else 1, 4)
    if case == "bf16":
        x, weight = x.bfloat16(), weight.bfloat16()
    if case == "strided weight":
        weight = torch.randn(4, 6).t()
    with torch.set_grad_enabled(case == "autograd"):
        y = gemv.linear(x, weight)
    torch.testing.assert_close(y, F.linear(x, weight))
    if case == "autograd":
        y.sum().backward()
        assert weight.grad is not None


def test_a_cpu_without_avx2_or_a_failed_build_falls_back_with_one_warning(monkeypatch):
    import torch.utils.cpp_extension

    x, weight = torch.randn(1, 4), torch.randn(6, 4)
    monkeypatch.setattr(gemv, "_kernel", None)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.warns(UserWarning, match="needs an x86 CPU with AVX2, this one reports DEFAULT"), torch.no_grad():
        torch.testing.assert_close(gemv.linear(x, weight), F.linear(x, weight))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # decided once: no second warning
        gemv.linear(x, weight)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension 'textrep_gemv': g++: not found\nmore lines")

    monkeypatch.setattr(gemv, "_kernel", None)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    with pytest.warns(UserWarning, match=r"did not build \(Error building extension 'textrep_gemv': g\+\+: not "
                                         r"found\); install a C\+\+ compiler"), torch.no_grad():
        torch.testing.assert_close(gemv.linear(x, weight), F.linear(x, weight))


def test_a_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_waited_for(monkeypatch, tmp_path):
    """torch's build lock is a file; a build killed mid-way leaves it, and every later build would wait forever."""
    import os

    import torch.utils.cpp_extension

    lock = tmp_path / "textrep_gemv" / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = lock.stat().st_mtime - gemv.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    built = []

    def load(**kwargs):
        built.append(kwargs["build_directory"])
        return "kernel"

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    monkeypatch.setattr(gemv, "_kernel", None)
    with pytest.warns(UserWarning, match="left 11 min ago by a build of models/gemv.cpp that did not finish"):
        assert gemv.kernel() == "kernel"
    assert not lock.exists() and built == [str(lock.parent)]
    lock.touch()  # a build running now: its lock stays
    monkeypatch.setattr(gemv, "_kernel", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gemv.kernel()
    assert lock.exists()


def test_the_build_finds_the_ninja_pip_put_beside_python_when_the_venv_is_not_activated(monkeypatch, tmp_path):
    """`make` runs .venv/bin/python without activating the venv, and a fresh machine may have no system ninja."""
    import os

    (tmp_path / "ninja").touch()
    monkeypatch.setattr(gemv.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(gemv.shutil, "which", lambda name: None)
    monkeypatch.setenv("PATH", "/usr/bin")
    with gemv._ninja_on_path():
        assert os.environ["PATH"].split(os.pathsep) == [str(tmp_path), "/usr/bin"]
    assert os.environ["PATH"] == "/usr/bin"
    monkeypatch.setattr(gemv.shutil, "which", lambda name: "/usr/bin/ninja")  # one on PATH already: left as it is
    with gemv._ninja_on_path():
        assert os.environ["PATH"] == "/usr/bin"


@pytest.mark.skipif(not BUILDABLE, reason="models/gemv.cpp is built for x86 CPUs with AVX2, with g++")
def test_mismatched_shapes_are_refused_not_read_past():
    with pytest.raises(RuntimeError, match=r"x \(M, in\) and weight \(out, in\) expected"):
        gemv.kernel().linear_rows(torch.randn(1, 5), torch.randn(3, 4), torch.empty(0))
    with pytest.raises(RuntimeError, match="bias of 2 values for 3 outputs"):
        gemv.kernel().linear_rows(torch.randn(1, 4), torch.randn(3, 4), torch.randn(2))
    with torch.no_grad(), pytest.raises(RuntimeError, match="cannot be multiplied"):  # through linear: F.linear's
        gemv.linear(torch.randn(1, 5), torch.randn(3, 4))
