"""The CUDA kernels of csrc/cuda/*.cu, run on the CPU through a small emulator (cuda_emu.h beside
this file), against the float64 spec. Catches indexing, masking and reduction mistakes on machines
without a GPU; tests/cuda/test_cuda_ops.py checks the real thing where a GPU exists.

Collected through tests/test_cuda_compile.py (which imports these tests): tests/conftest.py skips
everything under tests/cuda/ when no GPU is present, and these must run exactly there.

The .cu sources are copied with each ``k<<<grid, block, smem, stream>>>(...)`` rewritten to
``rwkv_emu::launch(k, grid, block, smem, stream, ...)`` and compiled by the host C++ compiler into
one shared library with C entry points (ctypes). Needs g++ and the CUDA headers (cuda_fp16.h);
skipped with the reason otherwise. Fast-math rounding is not emulated (exact expf and division).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from rwkv.ops import reference as ref

ROOT = Path(__file__).resolve().parents[3]
CUDA_SRC = ROOT / "csrc" / "cuda"
EMU = Path(__file__).resolve().parent
CXX = os.environ.get("CXX", "g++")


def _cuda_include():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc")
    cands = [Path(home) / "include"] if home else []
    if nvcc:
        out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True).stderr
        m = re.search(r"TOP=(\S+)", out)
        if m:
            cands.append(Path(m.group(1).strip('"')) / "include")
    cands.append(Path("/usr/local/cuda/include"))
    return next((c for c in cands if (c / "cuda_fp16.h").exists()), None)


CUDA_INC = _cuda_include()
needs_emu = pytest.mark.skipif(CUDA_INC is None or shutil.which(CXX) is None,
                               reason="needs a host C++ compiler and the CUDA headers")

API = r"""
#include "kernels.h"
using namespace rwkv::cuda;
extern "C" {
void emu_wkv4(long T, long C, const float* w, const float* u, const float* k, const float* v,
              float* y, float* aa, float* bb, float* pp) {
  wkv4_forward(T, C, w, u, k, v, y, aa, bb, pp, nullptr);
}
void emu_wkv5(long T, long H, long N, float* s, const float* r, const float* k, const float* v,
              const float* w, const float* u, float* y) {
  wkv5_forward(T, H, N, s, r, k, v, w, u, y, nullptr);
}
void emu_wkv6(long T, long H, long N, float* s, const float* r, const float* k, const float* v,
              const float* w, const float* u, float* y) {
  wkv6_forward(T, H, N, s, r, k, v, w, u, y, nullptr);
}
void emu_wkv7(long T, long H, long N, float* s, const float* r, const float* w, const float* k,
              const float* v, const float* a, const float* b, float* y) {
  wkv7_forward(T, H, N, s, r, w, k, v, a, b, y, nullptr);
}
void emu_linear_one(long N, long M, const void* x, const void* w, void* y, int vec) {
  linear_one_bf16(N, M, x, w, y, vec != 0, nullptr);
}
void emu_mm8(int act, long T, long N, long M, const void* x, long ldx, const unsigned char* w,
             const void* mx, const void* rx, const void* my, const void* ry, void* y, long ldy,
             int vec) {
  mm8_forward(static_cast<Act>(act), T, N, M, x, ldx, w, mx, rx, my, ry, y, ldy, vec != 0,
              nullptr);
}
void emu_ln_mix(int act, long T, long C, long n, const void* x, const void* sx, const float* w,
                const float* b, const float* mix, int lerp, float eps, void* xx, void* out) {
  ln_mix_forward(static_cast<Act>(act), T, C, n, x, sx, w, b, mix, lerp != 0, eps, xx, out,
                 nullptr);
}
void emu_wkv7_block(int act, long T, long H, long N, float* s, const void* r, const void* w,
                    const void* k, const void* v, const void* a, const void* g, const void* vf,
                    const void* vg, const float* p, float eps, float* tmp, void* y) {
  wkv7_block_forward(static_cast<Act>(act), T, H, N, s, r, w, k, v, a, g, vf, vg, p, eps, tmp, y,
                     nullptr);
}
}
"""

LAUNCH = re.compile(r"(\w+(?:<[^<>;]*>)?)\s*<<<([^>]*)>>>\s*\(")


@pytest.fixture(scope="module")
def emu_lib():
    with tempfile.TemporaryDirectory(prefix="rwkv-cuda-emu-") as tmp:
        tmp = Path(tmp)
        sources = []
        for cu in sorted(CUDA_SRC.glob("*.cu*")):  # kernels and .cuh headers (launches too)
            text = LAUNCH.sub(r"rwkv_emu::launch(\1, \2, ", cu.read_text())
            if cu.suffix == ".cu":
                out = tmp / (cu.stem + "_emu.cpp")
                out.write_text('#include "cuda_emu.h"\n' + text)
                sources.append(str(out))
            else:
                (tmp / cu.name).write_text(text)
        (tmp / "api.cpp").write_text(API)
        sources.append(str(tmp / "api.cpp"))
        so = tmp / "libemu.so"
        cmd = [CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", "-w", f"-I{EMU}",
               f"-I{tmp}", f"-I{CUDA_SRC}", f"-I{CUDA_INC}", *sources, "-o", str(so)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, f"emulated build failed:\n{' '.join(cmd)}\n{p.stderr[-5000:]}"
        yield ctypes.CDLL(str(so))


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def L(*xs):
    return [ctypes.c_long(int(x)) for x in xs]


def rand(shape, gen, lo=-1.0, hi=1.0, dtype=torch.float32):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def close(actual, expected, tol=2e-5):
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol * scale)


@pytest.fixture
def emu_gen():
    return torch.Generator().manual_seed(7)


@needs_emu
@pytest.mark.parametrize("T,C", [(3, 37), (2, 300)])
def test_emulated_wkv4(emu_lib, T, C, emu_gen):
    lib, gen = emu_lib, emu_gen
    w, u = -torch.exp(rand((C,), gen, -3, 1)), rand((C,), gen)
    k, v = rand((T, C), gen, -3, 3), rand((T, C), gen)
    aa, bb, pp = rand((C,), gen), rand((C,), gen, 0.5, 2), rand((C,), gen, -2, 2)
    want = ref.wkv4_math(*(t.double() for t in (w, u, k, v, aa, bb, pp)))
    y = torch.empty(T, C)
    lib.emu_wkv4(*L(T, C), *map(ptr, (w, u, k, v, y, aa, bb, pp)))
    for got, exp in zip((y, aa, bb, pp), want):
        close(got, exp)


SHAPES = [(3, 2, 16), (2, 1, 20), (3, 2, 32), (2, 2, 64), (2, 1, 33), (2, 1, 128), (1, 1, 256),
          (0, 1, 64)]


@needs_emu
@pytest.mark.parametrize("version", [5, 6, 7])
@pytest.mark.parametrize("T,H,N", SHAPES)
def test_emulated_wkv(emu_lib, version, T, H, N, emu_gen):
    lib, gen = emu_lib, emu_gen
    state = rand((H, N, N), gen)
    r, k, v = (rand((T, H * N), gen) for _ in range(3))
    y = torch.full((T, H * N), float("nan"))
    if version == 7:
        w = rand((T, H * N), gen, 0.6, 1.0)
        kk = torch.nn.functional.normalize(rand((T, H, N), gen), dim=-1)
        a, b = (-kk).reshape(T, H * N), (kk * rand((T, H, N), gen, 0, 1)).reshape(T, H * N)
        want_y, want_s = ref.wkv7_math(*(t.double() for t in (state, r, w, k, v, a, b)))
        lib.emu_wkv7(*L(T, H, N), *map(ptr, (state, r, w, k, v, a, b, y)))
    else:
        w = rand((T, H * N) if version == 6 else (H, N), gen, 0.6, 1.0)
        u = rand((H, N), gen)
        want_y, want_s = ref.wkv56_math(*(t.double() for t in (state, r, k, v, w, u)))
        fn = lib.emu_wkv6 if version == 6 else lib.emu_wkv5
        fn(*L(T, H, N), *map(ptr, (state, r, k, v, w, u, y)))
    close(y, want_y)
    close(state, want_s)


def quantized(N, M, gen, dtype):
    q = torch.randint(0, 256, (M, N), generator=gen, dtype=torch.uint8).t()  # column-major
    mx, rx = rand((M,), gen, -0.1, 0.1, dtype), rand((M,), gen, 0.001, 0.01, dtype)
    my, ry = rand((N, 1), gen, -0.1, 0.1, dtype), rand((N, 1), gen, 0.001, 0.01, dtype)
    return q, mx, rx, my, ry


ACT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@needs_emu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("T,N,M", [(1, 64, 48), (1, 40, 37), (3, 64, 20), (4, 48, 5),
                                   (9, 32, 16), (16, 17, 9), (20, 40, 70), (17, 100, 3),
                                   (70, 33, 65)])
def test_emulated_mm8(emu_lib, T, N, M, dtype, emu_gen):
    lib, gen = emu_lib, emu_gen
    q, mx, rx, my, ry = quantized(N, M, gen, dtype)
    x = rand((T, N), gen, -2, 2, dtype)
    y = torch.full((T, M), float("nan"), dtype=dtype)
    aligned = all(t.data_ptr() % 16 == 0 for t in (x, q, my, ry))
    for vec in ([0, 1] if N % 16 == 0 and aligned else [0]):
        lib.emu_mm8(ACT[dtype], *L(T, N, M), ptr(x), *L(N), ptr(q), ptr(mx), ptr(rx), ptr(my),
                    ptr(ry), ptr(y), *L(M), vec)
        want = ref.mm8_math(*(t.double() for t in (x, q, mx, rx, my, ry)))
        wdeq = (q.double() + 0.5) * ry.double() * rx.double() + my.double() + mx.double()
        bound = 1e-5 * float(x.double().abs().sum(1).max()) * float(wdeq.abs().max())
        if dtype != torch.float32:
            bound += 2 * float((want.to(dtype).double() - want).abs().max())
            bound += torch.finfo(dtype).eps * float(want.abs().max())
        err = float((y.double() - want).abs().max())
        assert err <= bound, (vec, err, bound)


@needs_emu
@pytest.mark.parametrize("N,M", [(64, 48), (40, 37), (20, 5), (1, 3), (256, 17)])
def test_emulated_linear_one(emu_lib, N, M, emu_gen):
    x = rand((N,), emu_gen, -1, 1, torch.bfloat16)
    w = rand((M, N), emu_gen, -1, 1, torch.bfloat16).t()  # column-major
    want = x.double() @ w.double()
    for vec in ([0, 1] if N % 8 == 0 else [0]):
        y = torch.full((M,), float("nan"), dtype=torch.bfloat16)
        emu_lib.emu_linear_one(*L(N, M), ptr(x), ptr(w), ptr(y), vec)
        err = float((y.double() - want).abs().max())
        bound = 2 * float((want.to(torch.bfloat16).double() - want).abs().max()) \
            + torch.finfo(torch.bfloat16).eps * max(1.0, float(want.abs().max())) + 1e-5 * N
        assert err <= bound, (vec, err, bound)


ACT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def close_act(actual, expected, dtype, tol=2e-5):
    """A result computed in fp32 and rounded once to dtype: fp32 tolerance plus half an ulp."""
    extra = 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps / 2
    close(actual, expected, tol + extra)


@needs_emu
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=str)
@pytest.mark.parametrize("lerp", [True, False], ids=["lerp", "delta"])
@pytest.mark.parametrize("T,C,n", [(1, 64, 6), (3, 33, 2), (2, 1100, 1), (300, 40, 1)])
def test_emulated_ln_mix(emu_lib, T, C, n, lerp, dtype, emu_gen):
    x, sx = rand((T, C), emu_gen, 2, 4, dtype), rand((C,), emu_gen, -1, 1, dtype)
    w, b = rand((C,), emu_gen, 0.5, 1.5), rand((C,), emu_gen, -0.5, 0.5)
    mix = rand((n, C), emu_gen, 0, 1)
    xx = torch.full((T, C), float("nan"), dtype=dtype)
    out = torch.full((n, T, C), float("nan"), dtype=dtype)
    emu_lib.emu_ln_mix(ACT[dtype], *L(T, C, n), *map(ptr, (x, sx, w, b, mix)), int(lerp),
                       ctypes.c_float(1e-5), ptr(xx), ptr(out))
    m = mix.double().unsqueeze(1)
    want_xx, want_out = ref.ln_mix_math(x.double(), sx.double(), w.double(), b.double(), m,
                                        1 - m if lerp else None, 1e-5)
    close_act(xx, want_xx, dtype)
    close_act(out, want_out, dtype)


@needs_emu
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=str)
@pytest.mark.parametrize("first_layer", [False, True], ids=["later", "first"])
@pytest.mark.parametrize("T,H,N", [(1, 2, 64), (3, 3, 20), (2, 1, 33), (2, 2, 32), (1, 2, 128), (2, 1, 256)])
def test_emulated_wkv7_block(emu_lib, T, H, N, first_layer, dtype, emu_gen):
    gen, C = emu_gen, H * N
    state = rand((H, N, N), gen)
    r, w, k, v, a, g = (rand((T, C), gen, -2, 2, dtype) for _ in range(6))
    vf, vg = (None, None) if first_layer else (rand((T, C), gen, -1, 1, dtype),
                                               rand((T, C), gen, -2, 2, dtype))
    ranges = ((-3, 1), (-1, 1), (-1, 1), (0.5, 1.5), (0, 1), (-1, 1), (0.5, 1.5), (-0.5, 0.5))
    p = torch.stack([rand((C,), gen, lo, hi) for lo, hi in ranges])
    eps = 64e-5
    S64 = state.double()
    opt = [None if t is None else t.double() for t in (vf, vg)]
    want_y = ref.wkv7_block_math(ref.wkv7_inplace_math, S64, *(t.double() for t in (r, w, k, v, a, g)),
                                 *opt, p.double().unbind(0), eps)
    tmp = torch.full((7 * T * C,), float("nan"))
    y = torch.full((T, C), float("nan"), dtype=dtype)
    emu_lib.emu_wkv7_block(ACT[dtype], *L(T, H, N), *map(ptr, (state, r, w, k, v, a, g)),
                           ptr(vf) if vf is not None else None, ptr(vg) if vg is not None else None,
                           ptr(p), ctypes.c_float(eps), ptr(tmp), ptr(y))
    close_act(y, want_y, dtype, 1e-4)  # the group norm divides by a head's spread
    close(state, S64)
