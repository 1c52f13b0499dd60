"""rwkv.strategy: parsing, normalization and layer allocation, pinned against upstream rwkv 0.8.32.

Every CPU case below is also run through the real upstream package (one child process for the
whole module, see tests/upstream.py) so the tables cannot drift from upstream's behaviour.
"""

import dataclasses
import doctest
import random
import re

import pytest

import rwkv.strategy
from rwkv.strategy import LayerPlacement, Segment, StrategyError, parse_strategy, plan_layers
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint
from tests.upstream import upstream_skip_reason, upstream_strategies

# (n_layer, strategy, expected slots as runs of (count, device, dtype spec, streamed)).
# n_layer + 1 slots in all; the last one is the head.
ALLOCATIONS = [
    # reference-behaviour.md 3.6 (L = 24)
    (24, "cpu fp32", [(25, "cpu", "fp32", False)]),
    (24, "cpu fp32 *10 -> cpu bf16", [(10, "cpu", "fp32", False), (15, "cpu", "bf16", False)]),
    (24, "cpu fp32 -> cpu bf16", [(12, "cpu", "fp32", False), (13, "cpu", "bf16", False)]),
    (24, "cpu fp32 -> cpu bf16 -> cpu fp32i8",
     [(8, "cpu", "fp32", False), (8, "cpu", "bf16", False), (9, "cpu", "fp32i8", False)]),
    (24, "cpu fp32 -> cpu bf16 *1", [(24, "cpu", "fp32", False), (1, "cpu", "bf16", False)]),
    (24, "cpu fp32 *30 -> cpu bf16", [(25, "cpu", "fp32", False)]),
    (24, "cpu fp32i8 *10+", [(10, "cpu", "fp32i8", False), (15, "cpu", "fp32i8", True)]),
    (24, "cpu fp32 *3 -> cpu bf16 *3+ -> cpu fp32i8 *3+",
     [(3, "cpu", "fp32", False), (3, "cpu", "bf16", False), (3, "cpu", "fp32i8", False),
      (16, "cpu", "fp32i8", True)]),
    (24, "cpu fp32 *0+ -> cpu bf16 *1", [(24, "cpu", "fp32", True), (1, "cpu", "bf16", False)]),
    # the last segment absorbs the remainder even with an explicit count
    (24, "cpu fp32 *10 -> cpu bf16 *5", [(10, "cpu", "fp32", False), (15, "cpu", "bf16", False)]),
    # a '+' segment starves free segments, before or after it
    (24, "cpu fp32 *10+ -> cpu bf16", [(10, "cpu", "fp32", False), (15, "cpu", "fp32", True)]),
    (24, "cpu bf16 -> cpu fp32 *5+", [(5, "cpu", "fp32", False), (20, "cpu", "fp32", True)]),
    (24, "cpu fp32 *3+ -> cpu bf16 *2",
     [(3, "cpu", "fp32", False), (20, "cpu", "fp32", True), (2, "cpu", "bf16", False)]),
    (24, "cpu fp32 *3+ -> cpu bf16 *2+", [(3, "cpu", "fp32", False), (2, "cpu", "bf16", False),
                                          (20, "cpu", "bf16", True)]),
    # the stream can reach the head
    (24, "cpu fp32 *24+ -> cpu bf16", [(24, "cpu", "fp32", False), (1, "cpu", "fp32", True)]),
    # a '+' segment that fills the allocation streams nothing; later segments are unused
    (24, "cpu fp32 *25+ -> cpu bf16", [(25, "cpu", "fp32", False)]),
    (24, "cpu fp32 *26+", [(25, "cpu", "fp32", False)]),
    (24, "cpu fp32 *5+ -> cpu bf16 *30", [(5, "cpu", "fp32", False), (20, "cpu", "bf16", False)]),
    (24, "cpu fp32 *5 -> cpu bf16 *20 -> cpu fp32i8",
     [(5, "cpu", "fp32", False), (20, "cpu", "bf16", False)]),
    (24, "cpu fp32 *5 -> cpu bf16 *30 -> cpu fp32i8",
     [(5, "cpu", "fp32", False), (20, "cpu", "bf16", False)]),
    # free segments: integer division in order, later ones larger
    (24, "cpu fp32 -> cpu bf16 -> cpu fp32i8 -> cpu bf16i8",
     [(6, "cpu", "fp32", False), (6, "cpu", "bf16", False), (6, "cpu", "fp32i8", False),
      (7, "cpu", "bf16i8", False)]),
    (24, "cpu fp32 *2 -> cpu bf16 -> cpu fp32i8 *3 -> cpu bf16i8",
     [(2, "cpu", "fp32", False), (10, "cpu", "bf16", False), (3, "cpu", "fp32i8", False),
      (10, "cpu", "bf16i8", False)]),
    (1, "cpu fp32 -> cpu bf16 -> cpu fp32i8", [(1, "cpu", "bf16", False), (1, "cpu", "fp32i8", False)]),
    # explicit *0 with no free segment: the last segment takes everything
    (24, "cpu fp32 *0 -> cpu bf16 *0", [(25, "cpu", "bf16", False)]),
    (24, "cpu fp32 *0", [(25, "cpu", "fp32", False)]),
    # '*0' plus a free segment is fine when an earlier count already fills the allocation
    (3, "cpu fp32 *5 -> cpu bf16 *0 -> cpu fp32i8", [(4, "cpu", "fp32", False)]),
    # fp16 on CPU, int8 everywhere
    (2, "cpu fp16 *1 -> cpu bf16i8", [(1, "cpu", "fp16", False), (2, "cpu", "bf16i8", False)]),
    (2, "cpu fp16i8", [(3, "cpu", "fp16i8", False)]),
    # whitespace, leading zeros, a single trailing newline, Unicode digits (upstream uses \d + int())
    (24, "  cpu fp32 *10->cpu bf16  ", [(10, "cpu", "fp32", False), (15, "cpu", "bf16", False)]),
    (24, "cpu fp32->  cpu bf16 *1", [(24, "cpu", "fp32", False), (1, "cpu", "bf16", False)]),
    (24, "cpu fp32 *010 -> cpu bf16\n", [(10, "cpu", "fp32", False), (15, "cpu", "bf16", False)]),
    (24, "cpu fp32 *\u0661\u0660 -> cpu bf16", [(10, "cpu", "fp32", False), (15, "cpu", "bf16", False)]),
    # non-CPU devices (allocation is device independent; not run through upstream here)
    (24, "cuda fp16 *10 -> cpu fp32", [(10, "cuda", "fp16", False), (15, "cpu", "fp32", False)]),
    (24, "cuda:1 fp16i8 *0+ -> cpu fp32 *1", [(24, "cuda:1", "fp16i8", True), (1, "cpu", "fp32", False)]),
    (24, "cuda:0 fp16 -> cuda:1 fp16", [(12, "cuda:0", "fp16", False), (13, "cuda:1", "fp16", False)]),
    (2, "mps fp32", [(3, "mps", "fp32", False)]),
]

# (strategy, n_layer or None, message regex, what upstream does with it).
# Upstream: "invalid" = its regex rejects it (ValueError "Invalid strategy"), None = it loads the
# model (we are deliberately stricter), otherwise the exception type it crashes with.
BAD = [
    ("", None, r"^empty strategy string; expected '<device> <dtype>' segments", "invalid"),
    ("   ", None, r"^blank strategy string '   '", "invalid"),
    ("cpu", None, r"segment 1 'cpu' has no dtype after the device; expected fp32, fp16 or bf16", "invalid"),
    ("cpu fp8", None,
     r"^invalid dtype 'fp8' in segment 1 'cpu fp8'; "
     r"expected fp32, fp16 or bf16 \(optionally followed by i8\)",
     "invalid"),
    ("cpu fp32 -> cpu fp8", None, r"^invalid dtype 'fp8' in segment 2 'cpu fp8'; expected fp32, fp16 or bf16",
     "invalid"),
    ("cpu f16", None, r"invalid dtype 'f16' in segment 1 'cpu f16' \(did you mean 'fp16'\?\)", "invalid"),
    ("cpu f16i8 *3 -> cpu fp32", None, r"'f16i8' in segment 1 'cpu f16i8 \*3' \(did you mean 'fp16i8'\?\)",
     "invalid"),
    ("f16", None, r"segment 1 'f16' does not start with a device: 'f16' looks like a dtype "
                  r"\(did you mean 'fp16'\?\); expected cpu, cuda, cuda:N or mps", "invalid"),
    ("fp16 cuda", None, r"segment 1 'fp16 cuda' does not start with a device", "invalid"),
    ("CUDA fp16", None, r"invalid device 'CUDA' in segment 1 'CUDA fp16': device names are lowercase, "
                        r"use 'cuda'; expected cpu, cuda, cuda:N or mps", "invalid"),
    ("cpu FP32", None, r"invalid dtype 'FP32' in segment 1 'cpu FP32': dtype names are lowercase, use 'fp32'",
     "invalid"),
    ("cpu fp32 -> Cuda:1 fp16", None, r"segment 2 'Cuda:1 fp16'.*use 'cuda:1'", "invalid"),
    ("cpu\tfp32", None, r"^tab in segment 1 'cpu\\tfp32' at column 4; tokens must be separated by single "
                        r"spaces", "invalid"),
    ("cpu  fp32", None, r"^two spaces in a row in segment 1 'cpu  fp32'; separate the tokens with exactly "
                        r"one space", "invalid"),
    ("cpu fp32  *10", None, r"two spaces in a row in segment 1 'cpu fp32  \*10'", "invalid"),
    ("cpu fp32\n\n", None, r"^line break in segment 1 'cpu fp32\\n'", "invalid"),
    ("cpu fp32\n -> cpu bf16", None, r"^line break in segment 1", "invalid"),
    ("->cpu fp32", None, r"^empty segment 1 '' before the first '->'.*IndexError", "IndexError"),
    (" -> cpu fp32 -> cpu bf16", None, r"^empty segment 1 ''", "invalid"),
    ("cpu fp32 ->", None, r"^empty segment 2 '' after the last '->'", "invalid"),
    ("cpu fp32 -> -> cpu bf16", None, r"^empty segment 2 '' between two '->'", "invalid"),
    ("dml fp16", None, r"^DirectML is not supported: device 'dml' in segment 1 'dml fp16'; expected cpu, "
                       r"cuda, cuda:N or mps", "NameError"),
    ("cpu fp32 *30 -> dml fp16", None, r"DirectML is not supported: device 'dml' in segment 2", None),
    ("cpu fp16i4", None, r"^unsupported quantization 'i4' in dtype 'fp16i4' of segment 1 'cpu fp16i4': only "
                         r"i8 is supported, i4 and i3 are not", None),
    ("cpu fp32 *1 -> cpu bf16i3", None, r"^unsupported quantization 'i3' in dtype 'bf16i3' of segment 2 "
                                        r"'cpu bf16i3'", None),
    ("cpu fp32 * 10", None, r"space after '\*' in segment 1 'cpu fp32 \* 10'; .*'\*10'", "invalid"),
    ("cpu fp32 *10 +", None, r"space before '\+' in segment 1 'cpu fp32 \*10 \+'; write '\*10\+'", "invalid"),
    ("cpu fp32 10", None, r"invalid layer count '10' in segment 1 'cpu fp32 10': it must start with '\*'",
     "invalid"),
    ("cpu fp32 *", None, r"invalid layer count '\*' in segment 1 'cpu fp32 \*': missing the number",
     "invalid"),
    ("cpu fp32 *1.5", None, r"invalid layer count '\*1.5' in segment 1 'cpu fp32 \*1.5'; expected '\*N'.*"
                            r"'\*N\+'", "invalid"),
    ("cpu fp32 *-1", None, r"invalid layer count '\*-1'", "invalid"),
    ("cpu fp16 i8", None, r"unexpected 'i8' in segment 1 'cpu fp16 i8': write the quantization directly "
                          r"after the dtype", "invalid"),
    ("cpu int8", None, r"invalid dtype 'int8' in segment 1 'cpu int8': the quantization is a suffix",
     "invalid"),
    ("gpu fp16", None, r"invalid device 'gpu' in segment 1 'gpu fp16' \(did you mean 'cuda'\?\)", "invalid"),
    ("cuda:x fp16", None, r"invalid CUDA device 'cuda:x' in segment 1 'cuda:x fp16'; expected 'cuda' or "
                          r"'cuda:N'", "invalid"),
    ("cuda: fp16", None, r"invalid CUDA device 'cuda:'", "invalid"),
    ("xpu bf16", None, r"^invalid device 'xpu' in segment 1 'xpu bf16'; expected cpu, cuda, cuda:N or mps",
     "invalid"),
    ("cpu fp32 *10 > cpu bf16", None,
     r"^unexpected token '>' in segment 1 'cpu fp32 \*10 > cpu bf16'; segments are separated by '->'",
     "invalid"),
    ("cpu fp32 *1 -> cpu bf16 *1 cpu fp16", None, r"^unexpected extra token 'cpu' in segment 2", "invalid"),
    ("cpu fp32 => cpu bf16", None, r"^unexpected token '=>' in segment 1 .*separated by '->'", "invalid"),
    # allocations upstream divides by zero on
    ("cpu fp32 *0 -> cpu bf16", 24,
     r"^segment 1 'cpu fp32 \*0' asks for 0 layers next to segment 2 'cpu bf16', which has no count"
     r".*ZeroDivisionError", "ZeroDivisionError"),
    ("cpu bf16 -> cpu fp32 *0", 24, r"segment 2 'cpu fp32 \*0' asks for 0 layers next to segment 1",
     "ZeroDivisionError"),
    ("cpu fp32 *5 -> cpu bf16 *0 -> cpu fp32i8", 24, r"segment 2 'cpu bf16 \*0'", "ZeroDivisionError"),
]

UPSTREAM_LAYERS = (1, 2, 3, 24)


def _expand(groups):
    out = []
    for count, device, spec, stream in groups:
        quant = "i8" if spec.endswith("i8") else None
        out += [LayerPlacement(device=device, dtype=spec[:4], quant=quant, stream=stream)] * count
    return out


def _upstream_normalized(text):
    """Upstream's normalization, written from reference-behaviour.md 3.2 (checked against upstream below)."""
    return "->".join(x.strip() for x in text.split("->")).replace("->", " -> ")


def _is_cpu(text):
    return all(s.device == "cpu" for s in parse_strategy(text).segments)


def _random_strategy(rng):
    segs = []
    for _ in range(rng.randint(1, 4)):
        seg = "cpu " + rng.choice(["fp32", "bf16", "fp16", "fp32i8", "bf16i8"])
        r = rng.random()
        if r < 0.55:
            count = rng.choice([0, 1, 1, 2, 3, 5, 8, 12, 20, 24, 25, 30])
            seg += f" *{count}" + ("+" if rng.random() < 0.3 else "")
        segs.append(seg)
    return "".join(rng.choice(["->", " -> ", " ->", "->  "]) + s if i else s for i, s in enumerate(segs))


def _random_cases(n, seed=1234):
    rng = random.Random(seed)
    return [(rng.choice(UPSTREAM_LAYERS), _random_strategy(rng)) for _ in range(n)]


RANDOM = _random_cases(40)


# ------------------------------------------------------------------------------------ pure tests


@pytest.mark.parametrize("n_layer,text,groups", ALLOCATIONS, ids=[repr(c[1]) for c in ALLOCATIONS])
def test_plan_layers_table(n_layer, text, groups):
    plan = plan_layers(parse_strategy(text), n_layer)
    assert len(plan) == n_layer + 1
    assert plan == _expand(groups)
    assert plan_layers(text, n_layer) == plan  # a string is parsed on the way


@pytest.mark.parametrize("n_layer,text,groups", ALLOCATIONS, ids=[repr(c[1]) for c in ALLOCATIONS])
def test_normalized_string(n_layer, text, groups):
    s = parse_strategy(text)
    assert s.normalized == _upstream_normalized(text)
    assert str(s) == s.normalized
    assert parse_strategy(s.normalized) == s  # normalization is idempotent


@pytest.mark.parametrize("text,n_layer,pattern,upstream", BAD, ids=[repr(c[0]) for c in BAD])
def test_rejections(text, n_layer, pattern, upstream):
    with pytest.raises(StrategyError) as info:
        if n_layer is None:
            parse_strategy(text)
        else:
            plan_layers(parse_strategy(text), n_layer)
    msg = str(info.value)
    assert re.search(pattern, msg, re.S), msg
    assert isinstance(info.value, ValueError)
    if text.strip(" ") and not text.startswith("\n"):
        # every message quotes the segment and ends with the string and a caret line
        assert re.search(r"segment \d+ '", msg), msg
        lines = msg.split("\n")
        assert lines[-2].startswith("    ") and set(lines[-1].strip()) == {"^"}, msg
        caret = lines[-1].index("^") - 4
        assert caret == info.value.position


def test_caret_points_at_bad_token():
    with pytest.raises(StrategyError) as info:
        parse_strategy("cpu fp32 -> cpu fp8")
    e = info.value
    assert (e.segment_index, e.segment_text, e.token, e.position) == (2, "cpu fp8", "fp8", 16)
    assert str(e).split("\n")[1:] == ["    cpu fp32 -> cpu fp8", "    " + " " * 16 + "^^^"]
    with pytest.raises(StrategyError) as info:
        plan_layers("cpu fp32 -> cpu bf16 *0", 5)
    e = info.value
    assert (e.segment_index, e.position) == (2, len("cpu fp32 -> cpu bf16 "))
    assert str(e).split("\n")[-1] == "    " + " " * e.position + "^^"


def test_segments_fields():
    s = parse_strategy(" cuda:1 fp16i8 *10+ ->cpu bf16 *3-> mps fp32")
    assert s.segments == (
        Segment(device="cuda:1", dtype="fp16", quant="i8", count=10, stream=True, text="cuda:1 fp16i8 *10+"),
        Segment(device="cpu", dtype="bf16", quant=None, count=3, stream=False, text="cpu bf16 *3"),
        Segment(device="mps", dtype="fp32", quant=None, count=None, stream=False, text="mps fp32"),
    )
    assert s.normalized == "cuda:1 fp16i8 *10+ -> cpu bf16 *3 -> mps fp32"
    assert s.plan(3) == plan_layers(s, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.segments[0].count = 3


def test_torch_dtypes():
    import torch

    p = plan_layers("cpu fp32 *1 -> cpu fp16i8 *1 -> cpu bf16", 2)
    assert [(x.atype, x.wtype) for x in p] == [
        (torch.float32, torch.float32),
        (torch.float16, torch.uint8),
        (torch.bfloat16, torch.bfloat16),
    ]
    seg = parse_strategy("cpu bf16i8").segments[0]
    assert (seg.atype, seg.wtype, seg.dtype_spec) == (torch.bfloat16, torch.uint8, "bf16i8")


def test_type_errors():
    for bad in (None, b"cpu fp32", 3, ["cpu fp32"]):
        with pytest.raises(TypeError, match="strategy must be a str"):
            parse_strategy(bad)
    with pytest.raises(TypeError, match="n_layer must be an int"):
        plan_layers("cpu fp32", 2.0)
    with pytest.raises(TypeError, match="n_layer must be an int"):
        plan_layers("cpu fp32", True)
    with pytest.raises(ValueError, match="n_layer must be at least 1"):
        plan_layers("cpu fp32", 0)


def test_import_is_cheap():
    import subprocess
    import sys

    code = "import sys, rwkv.strategy as s; s.plan_layers('cpu fp32i8 *1+', 4); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_docstring_examples():
    result = doctest.testmod(rwkv.strategy)
    assert result.attempted >= 8 and result.failed == 0


# ------------------------------------------------------------------------------ against upstream


@pytest.fixture(scope="module")
def upstream_rows(tmp_path_factory):
    """Every CPU case of this module through upstream's constructor, in one child process."""
    reason = upstream_skip_reason()
    if reason:
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("strategy-models")
    models = {
        n: save_checkpoint(d / f"v4-L{n}.pth", make_checkpoint("4", n_layer=n, n_embd=32, vocab=64))
        for n in UPSTREAM_LAYERS
    }
    items = [(n, t) for n, t, _ in ALLOCATIONS if _is_cpu(t)]
    items += [(n or 24, t) for t, n, _, _ in BAD]
    items += RANDOM
    rows = upstream_strategies(None, [(models[n], t) for n, t in items])
    return {(n, t): row for (n, t), row in zip(items, rows)}


CPU_ALLOCATIONS = [c for c in ALLOCATIONS if _is_cpu(c[1])]


@pytest.mark.parametrize("n_layer,text,groups", CPU_ALLOCATIONS, ids=[repr(c[1]) for c in CPU_ALLOCATIONS])
def test_table_matches_upstream(upstream_rows, n_layer, text, groups):
    row = upstream_rows[(n_layer, text)]
    assert row["error"] is None, row["error"]
    assert row["normalized"] == parse_strategy(text).normalized
    ours = [(p.device, p.atype, p.wtype, p.stream) for p in _expand(groups)]
    assert row["slots"] == ours


@pytest.mark.parametrize("text,n_layer,pattern,upstream", BAD, ids=[repr(c[0]) for c in BAD])
def test_rejections_vs_upstream(upstream_rows, text, n_layer, pattern, upstream):
    """Pins where we are stricter than upstream (upstream=None: it loads) and where it fails too."""
    row = upstream_rows[(n_layer or 24, text)]
    if upstream is None:
        assert row["error"] is None, row["error"]
    elif upstream == "invalid":
        assert row["error"] == "ValueError: Invalid strategy. Please read https://pypi.org/project/rwkv/"
    else:
        assert row["error"] is not None and row["error"].startswith(upstream + ":"), row["error"]


@pytest.mark.parametrize("n_layer,text", RANDOM, ids=[f"L{n}-{t!r}" for n, t in RANDOM])
def test_random_strategies_match_upstream(upstream_rows, n_layer, text):
    row = upstream_rows[(n_layer, text)]
    try:
        plan = plan_layers(parse_strategy(text), n_layer)
    except StrategyError as e:
        assert "ZeroDivisionError" in str(e)
        assert row["error"] is not None and row["error"].startswith("ZeroDivisionError"), row["error"]
        return
    assert row["error"] is None, row["error"]
    assert row["normalized"] == parse_strategy(text).normalized
    assert row["slots"] == [(p.device, p.atype, p.wtype, p.stream) for p in plan]
