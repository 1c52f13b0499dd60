"""rwkv.ops backend: resolve() modes and warnings, backend_report(), cpu_isa(), cpu_read_order()
and their hooks."""

import os
import platform
import subprocess
import sys
import warnings

import pytest
import torch
from ops_testlib import has_compiled

from rwkv import ops
from rwkv.ops import _backend, _testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code, **env):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_resolve_rejects_unknown_names_and_modes():
    with pytest.raises(ValueError, match="resolve: name must be one of wkv4_forward"):
        ops.resolve("wkv9_forward", "cpu")
    with pytest.raises(ValueError, match="resolve: mode must be one of auto, compiled, reference"):
        ops.resolve("wkv7_forward", "cpu", "fast")


def test_resolve_reference_and_compiled():
    assert ops.resolve("wkv7_forward", "cpu", "reference") is ops.reference.wkv7_forward
    if has_compiled("wkv7_forward", "cpu"):
        assert ops.resolve("wkv7_forward", "cpu", "compiled") is torch.ops.rwkv.wkv7_forward.default
        assert ops.resolve("wkv7_forward", "cpu") is torch.ops.rwkv.wkv7_forward.default


def test_resolve_accepts_a_torch_device():
    assert ops.resolve("wkv4_forward", torch.device("cpu"), "reference") is ops.reference.wkv4_forward


def test_auto_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(_backend, "_resolved", {})
    monkeypatch.setattr(_backend, "_warned", set())
    with pytest.warns(RuntimeWarning, match="slow pure-torch reference for mm8_one on 'xpu'"):
        assert ops.resolve("mm8_one", "xpu") is ops.reference.mm8_one
    _backend._resolved.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.resolve("mm8_one", "xpu")
    with pytest.raises(RuntimeError, match="no compiled mm8_one kernel for device type 'xpu'"):
        ops.resolve("mm8_one", "xpu", "compiled")


def test_backend_report_summary_line():
    first = ops.backend_report().splitlines()[0]
    if has_compiled("wkv7_forward", "cpu"):
        assert first.startswith(f"compiled (cpu: {ops.cpu_isa()}, {ops.cpu_read_order()} reads")
        assert ops.cpu_isa() in _testing.ISAS
    else:
        assert first.startswith("reference only: ")
    for op in ops.OPS:
        assert f"  {op}: cpu=" in ops.backend_report()


def test_force_cpu_isa_restores_previous(cpu_isa):
    before = ops.cpu_isa()
    with _testing.force_cpu_isa(cpu_isa) as active:
        assert ops.cpu_isa() == active == cpu_isa
    assert ops.cpu_isa() == before


def test_force_cpu_isa_rejects_bad_names():
    with pytest.raises(ValueError,
                       match="force_cpu_isa: isa must be one of scalar, avx2, avx512, avx512vnni, avx512bf16"):
        with _testing.force_cpu_isa("sse9"):
            pass
    if not has_compiled("wkv7_forward", "cpu"):
        pytest.skip("no compiled CPU kernels")
    with pytest.raises(RuntimeError,
                       match="_set_cpu_isa: isa must be scalar, avx2, avx512, avx512vnni, avx512bf16 or empty"):
        torch.ops.rwkv._set_cpu_isa("neon")
    supported = _testing.supported_cpu_isas()
    for isa in _testing.ISAS:
        if isa not in supported:
            with pytest.raises(RuntimeError, match="not supported by this CPU"):
                with _testing.force_cpu_isa(isa):
                    pass


def _cpuinfo(field: str) -> str:
    """The first value of ``field`` in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(field)), "")
    except OSError:
        return ""


def _isas_from_cpu_flags(flags: set) -> list:
    """The ISAs the kernels may use by the kernel's view of the CPU (Linux hides flags the OS
    does not save registers for), lowest first; the same rules as csrc/cpu/cpu_features.cpp."""
    isas = ["scalar"]
    if {"avx2", "fma"} <= flags:
        isas.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            isas.append("avx512")
            if "avx512_vnni" in flags:
                isas.append("avx512vnni")
                if "avx512_bf16" in flags:
                    isas.append("avx512bf16")
    return isas


def test_only_the_cpus_own_isas_are_detected_and_filled():
    """A wider ISA's code must never run on a CPU without it: even filling its kernel table
    (compiled with its flags) may execute its instructions and kill the process with SIGILL,
    as it did on an AVX2-only AMD EPYC. The tables filled must be exactly the CPU's ISAs."""
    if not has_compiled("wkv7_forward", "cpu"):
        pytest.skip("no compiled CPU kernels")
    flags = set(_cpuinfo("flags").split())
    if platform.machine() not in ("x86_64", "AMD64") or not flags:
        pytest.skip("needs an x86-64 Linux CPU to read the flags from /proc/cpuinfo")
    supported = _testing.supported_cpu_isas()
    assert supported == _isas_from_cpu_flags(flags)
    assert torch.ops.rwkv._cpu_isa_tables() == len(supported)
    # The kernels run in a fresh process too, where the tables are filled on first use.
    out = run_python("import torch, rwkv.ops as o; x = torch.randn(37);"
                     "print(o.cpu_isa(), torch.ops.rwkv._bf16_round(x).float().sub(x).abs().max() < 0.01)")
    assert out.stdout.split() == [supported[-1], "tensor(True)"]


@pytest.mark.parametrize("order", ("sequential", "streams"))
def test_force_cpu_read_order_restores_previous(order):
    if not has_compiled("mm8_one_i16", "cpu"):
        pytest.skip("no compiled CPU kernels")
    before = ops.cpu_read_order()
    with _testing.force_cpu_read_order(order) as active:
        assert ops.cpu_read_order() == active == order
    assert ops.cpu_read_order() == before


def test_force_cpu_read_order_rejects_bad_names():
    with pytest.raises(ValueError, match="force_cpu_read_order: order must be one of sequential, streams"):
        with _testing.force_cpu_read_order("rows"):
            pass
    if not has_compiled("mm8_one_i16", "cpu"):
        pytest.skip("no compiled CPU kernels")
    with pytest.raises(RuntimeError, match="_set_cpu_read_order: order must be sequential, streams"):
        torch.ops.rwkv._set_cpu_read_order("rows")


def test_env_sets_the_read_order_and_ignores_invalid_values():
    if not has_compiled("mm8_one_i16", "cpu"):
        pytest.skip("no compiled CPU kernels")
    code = "import rwkv.ops as o; print(o.cpu_read_order())"
    for order in ("sequential", "streams"):
        assert run_python(code, RWKV_CPU_READ_ORDER=order).stdout.strip() == order
    # "pairs" is accepted as another name of streams.
    assert run_python(code, RWKV_CPU_READ_ORDER="pairs").stdout.strip() == "streams"
    automatic = run_python(code, RWKV_CPU_READ_ORDER="").stdout.strip()
    # sequential on AMD CPUs with AVX-512 (Zen 4), where it reads faster; streams elsewhere,
    # AVX2-only AMD CPUs (Zen 3) included.
    vendor = _cpuinfo("vendor_id")
    zen4 = vendor == "AuthenticAMD" and "avx512" in _testing.supported_cpu_isas()
    assert automatic == ("sequential" if zen4 else "streams"), vendor
    out = run_python(code, RWKV_CPU_READ_ORDER="rows")
    assert out.stdout.strip() == automatic
    assert "RWKV_CPU_READ_ORDER must be sequential or streams, got 'rows'" in out.stderr


def test_import_does_not_load_the_extension():
    out = run_python("import sys, rwkv.ops; print('rwkv._C' in sys.modules)")
    assert out.stdout.strip() == "False"


def test_env_caps_the_isa_and_ignores_invalid_values():
    if not has_compiled("wkv7_forward", "cpu"):
        pytest.skip("no compiled CPU kernels")
    out = run_python("import rwkv.ops as o; print(o.cpu_isa())", RWKV_CPU_ISA="scalar")
    assert out.stdout.strip() == "scalar"
    out = run_python("import rwkv.ops as o; print(o.cpu_isa())", RWKV_CPU_ISA="sse9")
    assert out.stdout.strip() == _backend.cpu_isa() or out.stdout.strip() in _testing.ISAS
    assert "RWKV_CPU_ISA must be scalar, avx2, avx512, avx512vnni or avx512bf16, got 'sse9'" in out.stderr


def test_reference_only_when_extension_is_missing():
    code = (
        "import sys, warnings, torch; sys.modules['rwkv._C'] = None\n"
        "import rwkv.ops as o\n"
        "print(o.backend_report().splitlines()[0]); print(o.cpu_isa())\n"
        "s = torch.zeros(1, 2, 2); x = torch.ones(1, 2)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    o.wkv7(s, x, x, x, x, x, x); o.wkv7(s, x, x, x, x, x, x)\n"
        "print(len(w), w[0].message)\n"
    )
    lines = run_python(code).stdout.splitlines()
    assert lines[0].startswith("reference only: rwkv._C is not built")
    assert lines[1] == "none"
    assert lines[2].startswith("1 rwkv.ops: using the slow pure-torch reference for wkv7_forward")
