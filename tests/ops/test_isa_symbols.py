"""csrc/README.md's rule for the ISA files, checked on the objects the build left: each
csrc/cpu/kernels/isa_<isa>.cpp defines symbols only in its own namespace rwkv::cpu::<isa> (so no
AVX-512 copy of an inline function can stand in for a baseline one: the ODR trap) and calls only
C library functions, never C++ library code compiled for its instruction set."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ISA_SOURCES = sorted((ROOT / "csrc" / "cpu" / "kernels").glob("isa_*.cpp"))
# What the kernels may call: C functions of libm / libc (expf through __builtin_expf, lrintf for
# rounding, sqrtf, and memset from zero-filling loops).
C_FUNCTIONS = {"expf", "lrintf", "sqrtf", "memset", "memcpy"}


def _mangled_namespace(isa: str) -> str:
    return f"_ZN4rwkv3cpu{len(isa)}{isa}"


def test_every_isa_file_is_checked():
    names = {p.stem for p in ISA_SOURCES}
    assert {"isa_scalar", "isa_avx2", "isa_avx512", "isa_avx512vnni", "isa_avx512bf16"} <= names, names


@pytest.mark.parametrize("source", ISA_SOURCES, ids=lambda p: p.stem)
def test_isa_object_defines_only_its_namespace(source):
    objects = sorted(ROOT.glob(f"build/temp*/csrc/cpu/kernels/{source.stem}.o"))
    if not objects:
        pytest.skip("no build/ objects here (the extension was not built in this checkout)")
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    isa = source.stem[len("isa_"):]
    out = subprocess.run(["nm", str(objects[0])], capture_output=True, text=True, check=True).stdout
    defined, undefined = [], []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "U":
            undefined.append(fields[1])
        elif len(fields) == 3:
            defined.append((fields[1], fields[2]))
    assert defined, f"{objects[0]} defines nothing"
    # .LC<n>: the compiler's local constant pool (not linkable).
    foreign = [f"{kind} {name}" for kind, name in defined
               if not name.startswith(_mangled_namespace(isa)) and not name.startswith(".LC")]
    assert not foreign, f"{source.name} defines symbols outside rwkv::cpu::{isa}: {foreign[:5]}"
    assert any(kind == "T" and "fill_kernel_table" in name for kind, name in defined)
    calls = set(undefined) - C_FUNCTIONS
    assert not calls, f"{source.name} calls {sorted(calls)}: only C library functions are allowed"
