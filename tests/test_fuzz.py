"""Generated bad input, many cases per property: only our typed errors or valid results, never a crash,
and a caller's state left as it was when a call fails.

Hypothesis draws the cases (seeded from each test's name: ``derandomize=True``, no example database,
so every run tries the same cases). Inputs that reach native code (checkpoint files, token ids,
states, the tokenizers) run in a child process, a batch of cases per process (tests/_fuzz_child.py):
a crash kills only the child, and the parent names the case that was running. Strategy strings and
sampling arguments are pure Python/torch and run here.

Each property has a few examples of a few dozen cases; the whole file runs in well under a minute on
two cores.
"""

from __future__ import annotations

import functools
import json
import math
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rwkv.loading import CheckpointError, check_finite, inspect_checkpoint
from rwkv.sampling import sample_logits
from rwkv.strategy import StrategyError, parse_strategy, plan_layers
from tests._child import ROOT
from tests.fixtures.make_tiny_models import VERSIONS, make_checkpoint, save_checkpoint

# No shrinking: each step would start a child process, and the child names the failing case anyway.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=3, phases=[Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
# In-process properties: more, smaller examples (one example's draws must fit Hypothesis's buffer).
LOCAL = settings(FUZZ, max_examples=15, suppress_health_check=list(HealthCheck))
SMALL = dict(n_layer=2, n_embd=64, vocab=50, seed=11)
STRATEGIES = ("cpu fp32", "cpu bf16", "cpu fp32i8")


def run_batch(kind: str, payload: dict, tmp_path, timeout: float = 120) -> list:
    """Runs the cases in a child; returns one result dict per case. A child that dies fails the test
    naming the case it was running and how it died."""
    cases_file = tmp_path / f"{kind}-cases.pkl"
    cases_file.write_bytes(pickle.dumps(payload))
    proc = subprocess.run([sys.executable, "-m", "tests._fuzz_child", kind, str(cases_file)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    results = [r for r in lines if "case" in r]
    if proc.returncode != 0 or len(results) != len(payload["cases"]):
        started = [r["start"] for r in lines if "start" in r]
        running = payload["cases"][started[-1]] if started else None
        rc = proc.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        pytest.fail(f"the {kind} child died ({how}) while running case {running!r}\n{proc.stderr[-3000:]}")
    return results


def assert_allowed(results, cases, allowed):
    for r in results:
        case = cases[r["case"]]
        assert r["outcome"] in allowed, f"case {case!r:.400}: {r['outcome']}: {r['message']}"
        assert r["state_intact"], f"case {case!r:.400} changed the caller's state ({r['outcome']})"


# ------------------------------------------------------------------------------------ checkpoints
@functools.lru_cache(maxsize=1)
def base_files():
    """Raw bytes of a small .pth per version, their dicts, and a v7 .safetensors (a cached function,
    not a fixture, so that a failure report does not print them)."""
    d = Path(tempfile.mkdtemp(prefix="rwkv-fuzz-"))
    out = {}
    for v in VERSIONS:
        sd = make_checkpoint(v, **SMALL)
        out[v] = (save_checkpoint(d / f"{v}.pth", sd).read_bytes(), sd)
    from safetensors.torch import save_file

    save_file(make_checkpoint("7", **SMALL), str(d / "7.safetensors"))
    out["st"] = ((d / "7.safetensors").read_bytes(), None)
    shutil.rmtree(d)
    return out


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8, torch.complex64]
_KEY_MUTATIONS = (
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("add"), st.sampled_from(["blocks.0.att.extra", "blocks.2.ln1.weight", "blocks.x.y", "z",
                                               "blocks.-1.ln1.weight", "blocks.99999999999.a"])),
    st.tuples(st.just("rename"), st.integers(0, 10**6), st.text(max_size=12)),
    st.tuples(st.just("reshape"), st.integers(0, 10**6),
              st.lists(st.integers(0, 70), min_size=0, max_size=3), st.sampled_from(_DTYPES)),
    st.tuples(st.just("value"), st.integers(0, 10**6), st.sampled_from([math.nan, math.inf, -math.inf, 1e38])),
    st.tuples(st.just("flatten"), st.integers(0, 10**6)),
)
_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.02, 0.9999)),
    st.tuples(st.just("cut_tail"), st.integers(1, 5000)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("flip_head"), st.lists(st.integers(0, 8 * 600 - 1), min_size=1, max_size=4)),
    st.tuples(st.just("flip_tail"), st.lists(st.integers(0, 8 * 600 - 1), min_size=1, max_size=4)),
    *_KEY_MUTATIONS,
    st.tuples(st.just("not_a_dict"), st.sampled_from(["list", "tensor", "str", "nested"])),
)
_safetensors_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.02, 0.9999)),
    st.tuples(st.just("cut_tail"), st.integers(1, 5000)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("flip_head"), st.lists(st.integers(0, 8 * 2000 - 1), min_size=1, max_size=4)),
    st.tuples(st.just("json"), st.integers(0, 10**6), st.sampled_from(["shape", "dtype", "offsets", "drop"]),
              st.integers(-5, 10**6)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
)


def _flip(data: bytes, bits, from_end: bool) -> bytes:
    b = bytearray(data)
    for bit in bits:
        i = bit // 8 if not from_end else len(b) - 1 - bit // 8
        if 0 <= i < len(b):
            b[i] ^= 1 << (bit % 8)
    return bytes(b)


def _mutated_bytes(raw: bytes, m) -> bytes | None:
    """The file's bytes changed as a byte-level mutation says; None for other mutations."""
    kind = m[0]
    if kind == "truncate":
        return raw[: int(m[1] * len(raw))]
    if kind == "cut_tail":
        return raw[: -m[1]]
    if kind == "append":
        return raw + m[1]
    if kind in ("flip_head", "flip_tail"):
        return _flip(raw, m[1], kind == "flip_tail")
    return None


def _mutated_pth(raw: bytes, sd: dict, m) -> bytes | dict:
    data = _mutated_bytes(raw, m)
    if data is not None:
        return data
    kind = m[0]
    sd = dict(sd)
    keys = list(sd)
    if kind == "delete":
        del sd[keys[m[1] % len(keys)]]
    elif kind == "add":
        sd[m[1]] = torch.zeros(3)
    elif kind == "rename":
        k = keys[m[1] % len(keys)]
        sd[m[2]] = sd.pop(k)
    elif kind == "reshape":
        k = keys[m[1] % len(keys)]
        sd[k] = torch.zeros(m[2], dtype=m[3])
    elif kind == "value":
        k = keys[m[1] % len(keys)]
        t = sd[k].clone()
        t.view(-1)[m[1] % t.numel()] = m[2]
        sd[k] = t
    elif kind == "flatten":  # any tensor of 2 or more dimensions (matrices, low-rank factors, r_k)
        flat = [k for k in keys if sd[k].dim() >= 2]
        k = flat[m[1] % len(flat)]
        sd[k] = sd[k].reshape(-1)
    elif kind == "not_a_dict":
        return {"list": [1, 2], "tensor": torch.zeros(2), "str": "x", "nested": {"a": {"b": torch.zeros(1)}}}[m[1]]
    return sd


def _mutated_safetensors(raw: bytes, m) -> bytes:
    data = _mutated_bytes(raw, m)
    if data is not None:
        return data
    kind = m[0]
    if kind == "length":
        return m[1].to_bytes(8, "little") + raw[8:]
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    name = names[m[1] % len(names)]
    if m[2] == "shape":
        header[name]["shape"] = [abs(m[3]) % 100, 3]
    elif m[2] == "dtype":
        header[name]["dtype"] = ["F16", "I64", "BOOL", "U8", "F64", "XX"][abs(m[3]) % 6]
    elif m[2] == "offsets":
        header[name]["data_offsets"] = [m[3], m[3] + 4]
    else:
        del header[name]
    body = json.dumps(header).encode()
    return len(body).to_bytes(8, "little") + body + raw[8 + n:]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(VERSIONS + ("st",)), st.sampled_from(STRATEGIES), _mutation,
                          _safetensors_mutation), min_size=50, max_size=50))
def test_fuzzed_checkpoint_files_load_or_raise_checkpoint_error(tmp_path, batch):
    cases = []
    for n, (version, strategy, m, ms) in enumerate(batch):
        raw, sd = base_files()[version]
        if version == "st":
            path = tmp_path / f"c{n}.safetensors"
            path.write_bytes(_mutated_safetensors(raw, ms))
        else:
            path = tmp_path / f"c{n}.pth"
            data = _mutated_pth(raw, sd, m)
            if isinstance(data, bytes):
                path.write_bytes(data)
            else:
                torch.save(data, path)
        cases.append((str(path), strategy))
    results = run_batch("checkpoints", {"cases": cases}, tmp_path)
    assert_allowed(results, [(c, b) for c, b in zip(cases, batch)], {"ok", "CheckpointError"})


_dict_mutation = st.one_of(*_KEY_MUTATIONS)


@settings(LOCAL, max_examples=40)
@given(st.lists(st.tuples(st.sampled_from(VERSIONS), st.lists(_dict_mutation, min_size=1, max_size=3)),
                min_size=10, max_size=10))
def test_fuzzed_checkpoint_dicts_inspect_or_raise_checkpoint_error(batch):
    """Key and shape mutations, several at once, straight into the checks (pure Python and torch, so
    in process: many more cases than the file property)."""
    for version, mutations in batch:
        sd = base_files()[version][1]
        for m in mutations:
            sd = _mutated_pth(b"", sd, m)
        try:
            inspect_checkpoint(sd, "<fuzz>")
            check_finite(sd, "<fuzz>")
        except CheckpointError:
            pass


# -------------------------------------------------------------------------------- tokens and states
@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-models")
    return {v: str(save_checkpoint(d / f"{v}.pth", make_checkpoint(v, **SMALL))) for v in ("5.2", "7")}


_ids = st.one_of(st.integers(-3, 60), st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**70, -2**63]))
_token_input = st.tuples(
    st.sampled_from(["int", "list", "tuple", "nested", "floats", "strings", "ndarray", "tensor", "meta",
                     "dict", "set", "bytes", "generator", "str", "none"]),
    st.lists(_ids, max_size=6),
    st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
                     "bool"]),
)
_state_change = st.tuples(
    st.sampled_from(["none", "tuple", "drop", "extra", "not_a_list", "entry_none", "numpy", "dtype", "shape",
                     "meta", "transposed", "strided", "expanded", "nan", "huge", "grad", "sparse"]),
    st.integers(0, 100), st.integers(0, 100))


@FUZZ
@given(st.lists(st.one_of(
    st.tuples(st.just("tokens"), st.sampled_from(["5.2", "7"]), _token_input, st.booleans()),
    st.tuples(st.just("state"), st.sampled_from(["5.2", "7"]), _state_change)), min_size=60, max_size=60))
def test_fuzzed_tokens_and_states_run_or_raise_typed_errors(tmp_path, model_files, cases):
    results = run_batch("forward", {"cases": cases, "paths": model_files}, tmp_path)
    assert_allowed(results, cases, {"ok", "TokenError", "StateError"})


# ------------------------------------------------------------------------------------- tokenizers
_tokenizer_case = st.one_of(
    st.tuples(st.just("encode"), st.text(max_size=20)),
    st.tuples(st.just("encode"), st.lists(st.sampled_from(["a", "\ud800", "\udfff", "é", "\x00", "中", "🙂"]),
                                          max_size=8).map("".join)),
    st.tuples(st.just("encodeBytes"), st.binary(max_size=24)),
    st.tuples(st.just("encodeBytes_view"), st.binary(max_size=24)),
    st.tuples(st.sampled_from(["decode", "decodeBytes"]),
              st.lists(st.one_of(st.integers(-5, 70000), st.sampled_from([2**63, 2**64 - 1, 2**100, -2**70]),
                                 st.sampled_from([1.5, "a", None, True])), max_size=6)),
    st.tuples(st.just("decodeBytes_view"), st.lists(st.integers(-2**31, 2**31 - 1), max_size=6)),
)


@FUZZ
@given(st.lists(_tokenizer_case, min_size=80, max_size=80))
def test_fuzzed_tokenizer_inputs_agree_or_raise_value_or_type_errors(tmp_path, cases):
    hf_path = str(ROOT / "models" / "rwkv7-tiny" / "tokenizer.json")
    results = run_batch("tokenizers", {"cases": cases, "hf_path": hf_path}, tmp_path)
    assert_allowed(results, cases, {"ok", "ValueError", "TypeError", "KeyError", "UnicodeEncodeError",
                                    "UnicodeDecodeError"})


# ------------------------------------------------------------------------- in-process properties
_strategy_token = st.sampled_from(["cpu", "cuda", "cuda:0", "cuda:7", "mps", "dml", "fp32", "fp16", "bf16",
                                   "fp16i8", "fp32i8", "bf16i8", "fp8", "i8", "*", "+", "->", " ", "  ",
                                   "*0", "*3", "*3+", "*99999999999999999999", "\t", "：", "٣"])


@LOCAL
@given(st.lists(st.one_of(st.lists(_strategy_token, max_size=10).map("".join), st.text(max_size=30)),
                min_size=40, max_size=40),
       st.integers(1, 40))
def test_fuzzed_strategy_strings_parse_or_raise_strategy_error(texts, n_layer):
    for text in texts:
        try:
            plan = plan_layers(parse_strategy(text), n_layer)
        except StrategyError:
            continue
        assert len(plan) == n_layer + 1, text


_number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6),
                    st.sampled_from([None, "1", True, 2.5, np.float32(0.5), np.int64(3)]))


@LOCAL
@given(st.lists(st.tuples(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=20),
                          _number, _number, _number), min_size=20, max_size=20))
def test_fuzzed_sampling_arguments_sample_or_raise_value_or_type_error(cases):
    for values, temperature, top_p, top_k in cases:
        logits = torch.tensor(values, dtype=torch.float32)
        before = logits.clone()
        try:
            token = sample_logits(logits, temperature, top_p, top_k, generator=0)
        except (ValueError, TypeError):
            pass
        else:
            assert 0 <= token < len(values)
        assert torch.equal(torch.nan_to_num(logits), torch.nan_to_num(before))
