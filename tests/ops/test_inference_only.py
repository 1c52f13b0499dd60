"""The ops' own Autograd kernel (csrc/inference_only.cpp): registered for every op of OPS once the
compiled backend loads; under grad mode an argument that requires grad (a tensor, or one of a
list) is refused with a ValueError naming the op and the argument; otherwise, and always under
no_grad or inference_mode, the call reaches the backend's kernel with the same result."""

import pytest
import torch
from ops_testlib import compiled_or_skip, uniform

from rwkv import ops


@pytest.fixture(scope="module")
def compiled():
    compiled_or_skip("linear_one")
    return True


def linear_inputs(rng):
    x = uniform((1, 48), rng)
    w = uniform((20, 48), rng).t()  # column-major [48, 20]
    return x, w


def test_every_op_has_its_autograd_kernel(compiled):
    missing = [op for op in ops.OPS
               if not torch._C._dispatch_has_kernel_for_dispatch_key(f"rwkv::{op}", "Autograd")]
    assert missing == []


def test_registering_again_is_harmless(compiled, rng):
    torch.ops.rwkv._inference_only(["linear_one", "linear_one"])
    x, w = linear_inputs(rng)
    with torch.no_grad():
        expected = torch.ops.rwkv.linear_one(x, w)
    assert torch.equal(torch.ops.rwkv.linear_one(x, w), expected)
    with pytest.raises(ValueError, match="requires grad"):
        torch.ops.rwkv.linear_one(x.requires_grad_(), w)


def test_tensor_argument_requiring_grad_is_refused(compiled, rng):
    x, w = linear_inputs(rng)
    with pytest.raises(ValueError, match=r"rwkv::linear_one: argument 'x' requires grad.*"
                                         r"torch\.no_grad\(\)"):
        torch.ops.rwkv.linear_one(x.requires_grad_(), w)
    with pytest.raises(ValueError, match=r"rwkv::linear_one: argument 'w' requires grad"):
        torch.ops.rwkv.linear_one(x.detach(), w.detach().requires_grad_())


def test_list_argument_requiring_grad_is_refused(compiled, rng):
    x, w = linear_inputs(rng)
    w2 = uniform((20, 48), rng).t()
    with pytest.raises(ValueError, match=r"rwkv::linear_one_group: argument 'w' requires grad"):
        torch.ops.rwkv.linear_one_group([x, x], [w, w2.requires_grad_()], [], [0, 0])


def test_state_argument_requiring_grad_is_refused(compiled, rng):
    compiled_or_skip("wkv5_forward")
    H, N = 2, 4
    state = uniform((H, N, N), rng).requires_grad_()
    before = state.detach().clone()
    r, k, v = (uniform((1, H * N), rng) for _ in range(3))
    w, u = uniform((H, N), rng, 0.1, 0.9), uniform((H, N), rng)
    with pytest.raises(ValueError, match=r"rwkv::wkv5_forward: argument 'state' requires grad"):
        torch.ops.rwkv.wkv5_forward(state, r, k, v, w, u)
    assert torch.equal(state.detach(), before)  # refused before anything was written


@pytest.mark.parametrize("context", ["grad_mode_plain_inputs", "no_grad", "inference_mode"])
def test_calls_that_need_no_gradient_run(compiled, rng, context):
    x, w = linear_inputs(rng)
    with torch.no_grad():
        expected = torch.ops.rwkv.linear_one(x, w)
    if context == "grad_mode_plain_inputs":
        out = torch.ops.rwkv.linear_one(x, w)
    elif context == "no_grad":
        with torch.no_grad():
            out = torch.ops.rwkv.linear_one(x.requires_grad_(), w.requires_grad_())
    else:
        with torch.inference_mode():
            out = torch.ops.rwkv.linear_one(x.requires_grad_(), w)
    assert torch.equal(out, expected)
    assert not out.requires_grad
