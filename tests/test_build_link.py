"""rwkv._C keeps what its link takes from static archives private (setup.py, PRIVATE_ARCHIVES).

Some toolchains link libstdc++ statically into shared objects (the GPU machine's /opt/gcc g++
does). Then, without ``-Wl,--exclude-libs,ALL``, the extension's copies of libstdc++'s functions
used the process's shared libstdc++ data (locale facet ids), and formatting a number in an error
message crashed the process there (here: the message breaks off at the first number). These tests
relink the objects of the build that ``make test`` just made with ``-static-libstdc++``, with and
without the flag, and raise an error whose message holds numbers in a child process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
FLAG = "-Wl,--exclude-libs,ALL"
BUILD_LOG = ROOT / "build" / "build.log"
CHILD = """
import sys, torch
import rwkv.ops._schemas  # the op schemas; the kernels come from the relinked library
torch.ops.load_library(sys.argv[1])
state, rows = torch.zeros(2, 8, 8), [torch.zeros(3, 16) for _ in range(6)]
try:
    torch.ops.rwkv.wkv7_forward(state.transpose(1, 2), *rows)
except RuntimeError as e:
    print(str(e).splitlines()[0])
"""
WANT = "wkv7_forward: state must be contiguous, got strides [64, 1, 8]"


def _objects() -> list:
    """The CPU build's objects (module.o and csrc/cpu/**), newest build folder."""
    temps = sorted((ROOT / "build").glob("temp.*"))
    if not temps:
        return []
    csrc = temps[-1] / "csrc"
    return sorted(str(p) for p in [*csrc.glob("*.o"), *csrc.glob("cpu/**/*.o")])


def _message(tmp_path: Path, extra: list) -> str:
    so = tmp_path / ("private.so" if extra else "shared.so")
    lib = Path(torch.__file__).parent / "lib"
    cmd = [shutil.which("g++") or "g++", "-shared", "-Wl,-Bsymbolic-functions", "-static-libstdc++",
           *_objects(), f"-L{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-fopenmp",
           *extra, "-o", str(so)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    r = subprocess.run([sys.executable, "-c", CHILD, str(so)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    return f"rc={r.returncode} {r.stdout.strip()}"


def _cpu_build() -> bool:
    return BUILD_LOG.exists() and "with CUDA=no" in BUILD_LOG.read_text() and bool(_objects())


needs_build = pytest.mark.skipif(not _cpu_build(), reason="needs a CPU-only build's objects and "
                                                          "build/build.log (make build)")


@needs_build
def test_extension_link_uses_the_flag():
    link = [ln for ln in BUILD_LOG.read_text().splitlines() if "-shared" in ln and "rwkv/_C." in ln]
    assert link, "no link line of rwkv._C in build/build.log"
    assert FLAG in link[-1]


@needs_build
def test_static_libstdcxx_kept_private_formats_numbers(tmp_path):
    assert _message(tmp_path, [FLAG]) == f"rc=0 {WANT}"
    # The control: the same link without the flag mangles (or crashes on) the same message on
    # this toolchain, which is what the flag is for.
    assert _message(tmp_path, []) != f"rc=0 {WANT}"
