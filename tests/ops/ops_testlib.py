"""Helpers for the op tests: picking an implementation, random inputs, fp32-vs-float64 checks."""

from __future__ import annotations

import pytest
import torch

from rwkv import ops
from rwkv.ops import _backend

IMPLS = ("compiled", "reference")


def has_compiled(op: str, device: str) -> bool:
    _backend._load()
    return _backend.has_kernel(op, _backend._dispatch_key(device))


def implementation(op: str, impl: str, device: str):
    """The op's callable for impl "compiled" (skips the test without a kernel) or "reference"."""
    if impl == "compiled" and not has_compiled(op, device):
        pytest.skip(f"no compiled {op} kernel for {device}: {ops.backend_report().splitlines()[0]}")
    return ops.resolve(op, device, impl)


def compiled_or_skip(op: str, device: str = "cpu"):
    return implementation(op, "compiled", device)


def with_threads(threads, f):
    """f() with torch's thread count set to threads, restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return f()
    finally:
        torch.set_num_threads(before)


def uniform(shape, rng, lo=-1.0, hi=1.0, device="cpu", dtype=torch.float32):
    t = torch.rand(shape, generator=rng, dtype=torch.float64) * (hi - lo) + lo
    return t.to(device=device, dtype=dtype)


def f64(*tensors):
    return [t.double() for t in tensors]


def assert_close_f32(actual, expected64, rtol=2e-5, atol=2e-5):
    """fp32 result against a float64 evaluation of the spec; atol scales with the result."""
    assert actual.dtype == torch.float32, actual.dtype
    _assert_close_scaled(actual, expected64, rtol, atol)


def _assert_close_scaled(actual, expected64, rtol, atol):
    """assert_close in float64 with atol scaled by the expected result's magnitude (at least 1)."""
    scale = max(1.0, float(expected64.abs().max())) if expected64.numel() else 1.0
    torch.testing.assert_close(actual.double().cpu(), expected64.cpu(), rtol=rtol, atol=atol * scale)


#: The activation dtypes of the fused CPU ops (ln_mix, maa_mix, wkv6_block, wkv7_block).
ACT_DTYPES = (torch.float32, torch.bfloat16)
ACT_IDS = ("fp32", "bf16")


def assert_close_act(actual, expected64, dtype, rtol=2e-5, atol=2e-5):
    """A fused op's result in its activation dtype against the float64 spec: fp32 as
    assert_close_f32; bf16 is computed in fp32 and rounded once, so it may also be off by half a
    bf16 ulp (2^-8 of the value)."""
    assert actual.dtype == dtype, actual.dtype
    _assert_close_scaled(actual, expected64, rtol if dtype == torch.float32 else 2 ** -8 + rtol, atol)


def assert_low_precision_ok(actual, expected64, low_precision_ref):
    """bf16/fp16: the max error vs float64 may be at most 2x that of the spec run in the low
    precision (plus one ulp of slack for tiny results)."""
    err = (actual.double() - expected64).abs().max().item()
    err_low = (low_precision_ref.double() - expected64).abs().max().item()
    ulp = torch.finfo(actual.dtype).eps * max(1.0, expected64.abs().max().item())
    assert err <= 2 * err_low + ulp, (err, err_low)


def assert_block_sequence_equals_steps(fn, state, rows, p, eps):
    """A block op (wkv6_block, wkv7_block) over T tokens in one call gives the bits of T one-token
    calls, output and state. rows: its [T, H*N] arguments in order, then p and eps."""
    T = rows[0].shape[0]
    s_seq, s_one = state.clone(), state.clone()
    y_seq = fn(s_seq, *rows, p, eps)
    y_one = torch.cat([fn(s_one, *(t[i:i + 1] for t in rows), p, eps) for i in range(T)])
    torch.testing.assert_close(y_seq, y_one, rtol=0, atol=0)
    torch.testing.assert_close(s_seq, s_one, rtol=0, atol=0)


# The block ops' optional state_in (wkv6_block, wkv7_block): the old state, read instead of
# state's own contents. Rejections for a [2, 8, 8] state: match patterns with {op} for the op name.
STATE_IN_REJECT_CASES = {
    "state_in_dtype": "{op}: state_in must be float32, got float64",
    "state_in_shape": r"{op}: state_in must have state's shape \[2, 8, 8\], got \[2, 8, 4\]",
    "state_in_strided": r"{op}: state_in must be contiguous, got strides \[64, 1, 8\]",
    "state_in_overlap": "{op}: state_in must be state itself or not overlap it",
}


def bad_state_in(case: str, state: torch.Tensor) -> tuple:
    """(state, state_in) for a STATE_IN_REJECT_CASES case, from a valid [2, 8, 8] state."""
    if case == "state_in_dtype":
        return state, state.double()
    if case == "state_in_shape":
        return state, state[:, :, :4].contiguous()
    if case == "state_in_strided":
        return state, state.transpose(1, 2)
    buf = torch.cat([state, state[:1]])  # [3, 8, 8]: two states sharing one head
    return buf[:2], buf[1:]


def assert_state_in_equals_in_place(fn, state, args, eps):
    """fn(fresh, *args, eps, state) equals the in-place fn(copy of state, *args, eps) bit for bit,
    never reads fresh's old contents (NaN), leaves state (state_in) unchanged; and state_in may
    be state itself."""
    before = state.clone()
    in_place = state.clone()
    y_in_place = fn(in_place, *args, eps)
    fresh = torch.full_like(state, float("nan"))
    y = fn(fresh, *args, eps, state)
    assert torch.equal(y, y_in_place) and torch.equal(fresh, in_place)
    assert torch.equal(state, before)
    same = before.clone()
    assert torch.equal(fn(same, *args, eps, same), y_in_place) and torch.equal(same, in_place)


def opcheck_state_in(op: str, state, args, eps):
    """torch.library.opcheck of block op ``op`` given a fresh state and state_in = state."""
    torch.library.opcheck(getattr(torch.ops.rwkv, op).default, (torch.empty_like(state), *args, eps, state))
