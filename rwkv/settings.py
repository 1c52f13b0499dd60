"""Every environment variable the package reads: one registry, read here and nowhere else.

Keyword arguments of ``RWKV(...)`` are the primary interface; a variable sets the default of the
keyword it names, for scripts and programs that cannot pass one. Variables are read when they are
needed (``RWKV(...)`` being built, the compiled kernels being loaded), never at import. A value
that cannot be parsed warns once (``RuntimeWarning``) and the default is used. The C++ extension
reads no environment variable: ``rwkv.ops`` passes it the values it needs.

``SETTINGS`` lists the run-time variables, ``BUILD_SETTINGS`` those ``setup.py`` reads when the
extension is compiled. The README's settings table is ``markdown_table()`` (a test checks it).

    >>> from rwkv import settings
    >>> settings.value("RWKV_CPU_PLAN")           # True unless RWKV_CPU_PLAN=0
    True
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One environment variable.

    kind: "flag" (1/0, true/false, yes/no, on/off), "int", "choice" (one of ``choices``; ``aliases``
    maps other accepted spellings to them), "text" (any text) or "accepted" (read by upstream,
    changes nothing here).
    default: the value used when the variable is unset, empty or invalid (None: no value, the
    keyword's or the automatic choice applies). keyword: the ``RWKV(...)`` keyword that wins over
    the variable, if any."""

    name: str
    kind: str
    default: Any
    meaning: str
    choices: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    keyword: str | None = None

    def type_text(self) -> str:
        """The accepted values, as the README table shows them."""
        if self.kind == "flag":
            return "0 or 1"
        if self.kind == "int":
            return "integer"
        if self.kind == "choice":
            return " \\| ".join(self.choices)
        if self.kind == "text":
            return "text"
        return "any (ignored)"

    def default_text(self) -> str:
        """The default, as the README table shows it."""
        if self.kind == "accepted":
            return "-"
        if self.default is None:
            return "automatic" if self.kind in ("choice", "text") else "unset"
        if self.kind == "flag":
            return "1" if self.default else "0"
        return str(self.default)


SETTINGS: tuple[Setting, ...] = (
    Setting("RWKV_KERNELS", "choice", "auto",
            "Which op implementations the model uses: compiled kernels where registered, else the "
            "pure-torch reference with a warning (auto); compiled kernels or an error (compiled); "
            "the reference only (reference).",
            choices=("auto", "compiled", "reference"), keyword="kernels"),
    Setting("RWKV_EXACT_INT8", "flag", False,
            "1: one-token int8 products on CPU in fp32, as upstream computes them, instead of "
            "rounding the activation to int16 for exact integer dot products.",
            keyword="exact_int8"),
    Setting("RWKV_CPU_PLAN", "flag", True,
            "0: decode steps on CPU (one-token calls, the batched engine's steps) run op by op in "
            "Python instead of as compiled step plans (the same results).",
            keyword="cpu_plan"),
    Setting("RWKV_CPU_ISA", "choice", None,
            "Caps the instruction set of the CPU kernels (the highest the CPU and OS support is "
            "used otherwise).",
            choices=("scalar", "avx2", "avx512", "avx512vnni", "avx512bf16")),
    Setting("RWKV_CPU_READ_ORDER", "choice", None,
            "How one-token products read a matrix: one column after another (sequential) or as 4 "
            "streams with a software prefetch (streams). Automatic: sequential on AMD CPUs with "
            "AVX-512, streams elsewhere. Results are the same bits either way.",
            choices=("sequential", "streams"), aliases=(("pairs", "streams"),)),
    Setting("RWKV_CPU_HUGEPAGES", "flag", True,
            "0: keep CPU weights out of transparent huge pages (on Linux the model otherwise "
            "moves them there, which streams them faster).",
            ),
    Setting("RWKV_RESCALE_LAYER", "int", None,
            "Upstream's meaning: halve the activations every N layers in fp16 (unset: 6 when the "
            "strategy names fp16, else 0; RWKV-7 never rescales).",
            keyword="rescale_layer"),
    Setting("RWKV_JIT_ON", "accepted", None,
            "Upstream's TorchScript switch. Accepted for compatibility; our kernels are compiled "
            "ahead of time."),
    Setting("RWKV_CUDA_ON", "accepted", None,
            "Upstream's CUDA-kernel switch. Accepted for compatibility; CUDA kernels are used "
            "whenever the extension was built with them."),
    Setting("RWKV_V7_ON", "accepted", None,
            "Upstream's RWKV-7 switch. Accepted for compatibility; the version is detected from "
            "the checkpoint's keys."),
    Setting("RWKV_DML_ON", "accepted", None,
            "Upstream's DirectML switch. Accepted for compatibility; DirectML (`dml`) strategies "
            "are refused with a message."),
    Setting("RWKV_DE_VERSION", "accepted", None,
            "DeepEmbed checkpoints are detected from their keys; accepted for upstream "
            "compatibility."),
)

#: Read by setup.py only, when the extension is compiled (setup.py cannot import the package it
#: builds; tests/test_settings.py checks that it reads exactly these).
BUILD_SETTINGS: tuple[Setting, ...] = (
    Setting("RWKV_BUILD_EXT", "flag", True,
            "0: install without the C++ extension (pure Python, reference ops only)."),
    Setting("RWKV_BUILD_CUDA", "choice", "auto",
            "Compile the CUDA kernels: when nvcc is found and torch is a CUDA build (auto), never "
            "(0) or always (1).", choices=("auto", "0", "1")),
    Setting("TORCH_CUDA_ARCH_LIST", "text", "7.5;8.0;8.6;8.9;9.0+PTX",
            "The GPU architectures the CUDA kernels are compiled for (torch's convention)."),
    Setting("MAX_JOBS", "int", None, "Parallel compile jobs (torch's convention)."),
    Setting("DEBUG", "flag", False, "1: compile without optimisation, with debug information."),
    Setting("RWKV_SANITIZE", "flag", False,
            "1: compile with AddressSanitizer + UBSan, CPU only (`make sanitize` builds this into "
            "build-asan/, never in place)."),
    Setting("CUDA_HOME", "text", None, "Where the CUDA toolkit is (also CUDA_PATH); nvcc is looked "
            "for there."),
    Setting("CUDA_PATH", "text", None, "As CUDA_HOME."),
)

_BY_NAME = {s.name: s for s in SETTINGS}
_warned: set = set()


def registered(name: str) -> bool:
    """Whether ``name`` is a registered run-time or build setting."""
    return name in _BY_NAME or any(s.name == name for s in BUILD_SETTINGS)


def setting(name: str) -> Setting:
    """The run-time Setting called ``name``; KeyError naming the registered ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"rwkv.settings: {name!r} is not a registered setting; registered: "
                       f"{', '.join(_BY_NAME)}") from None


def _warn(s: Setting, raw: str, expected: str, using: str) -> None:
    if (s.name, raw) in _warned:
        return
    _warned.add((s.name, raw))
    warnings.warn(f"{s.name} must be {expected}, got {raw!r}; {using}", RuntimeWarning, stacklevel=4)


def parse(s: Setting, raw: str | None) -> Any:
    """The value of setting ``s`` for the text ``raw`` (None: unset). Unparsable text warns and
    gives the default."""
    if s.kind == "accepted":
        return raw
    text = "" if raw is None else raw.strip()
    if text == "":
        return s.default
    if s.kind == "flag":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        _warn(s, raw, "0 or 1", f"using {s.default_text()}")
        return s.default
    if s.kind == "text":
        return text
    if s.kind == "int":
        try:
            return int(text)
        except ValueError:
            _warn(s, raw, "an integer", "using the default")
            return s.default
    low = text.lower()
    low = dict(s.aliases).get(low, low)
    if low in s.choices:
        return low
    expected = ", ".join(s.choices[:-1]) + " or " + s.choices[-1]
    _warn(s, raw, expected, "ignoring it" if s.default is None else f"using {s.default!r}")
    return s.default


def raw(name: str) -> str | None:
    """The text of a registered variable as the environment holds it (None: unset)."""
    return os.environ.get(setting(name).name)


def value(name: str) -> Any:
    """The parsed value of the registered run-time setting ``name`` from the environment now."""
    return parse(setting(name), raw(name))


def markdown_table(build: bool = False) -> str:
    """The run-time settings (``build=True``: the build settings) as the README's tables
    (generated here; a test compares them with the README)."""
    if build:
        rows = ["| variable | values | default | meaning |", "| --- | --- | --- | --- |"]
        rows += [f"| `{s.name}` | {s.type_text()} | {s.default_text()} | {s.meaning} |" for s in BUILD_SETTINGS]
        return "\n".join(rows)
    rows = ["| variable | values | default | keyword | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        keyword = f"`{s.keyword}=`" if s.keyword else ""
        rows.append(f"| `{s.name}` | {s.type_text()} | {s.default_text()} | {keyword} | {s.meaning} |")
    return "\n".join(rows)
