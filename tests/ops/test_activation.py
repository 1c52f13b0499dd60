"""The ``act`` argument of the one-token products (linear_one, mm8_one_i16): each activation, every
CPU ISA, against the same product without it followed by the torch function; the fallback path of
mm8_one_i16; opcheck; out-of-range codes; the in-place activations of the models' sequence
products."""

import pytest
import torch
import test_linear_one
import test_mm8
from ops_testlib import IMPLS, compiled_or_skip, implementation, uniform

from rwkv.ops import _testing
from rwkv.ops._checks import ACTIVATIONS
from rwkv.ops import reference as ref
from rwkv.ops.reference import ACTIVATION_FNS

OPS = ("linear_one", "mm8_one_i16")
N, M = 300, 70


def inputs(op, rng, dtype=torch.float32):
    if op == "linear_one":
        return test_linear_one.make_inputs(N, M, rng, dtype=dtype)
    # Outputs of both signs and a few units (every activation's curved part): sum(x) ~ 1, so the
    # column offsets mx (in [-4, 4]) set y, the int8 part adding a little to each column.
    w = test_mm8.make_weight(N, M, rng)
    x = uniform((N,), rng, 0, 2 / N, dtype=dtype)
    mx = uniform((M,), rng, -4, 4, dtype=dtype)
    rx = uniform((M,), rng, 0.01, 0.1, dtype=dtype) / 16
    my = uniform((N, 1), rng, -0.1, 0.1, dtype=dtype)
    ry = uniform((N, 1), rng, 0.01, 0.1, dtype=dtype) / 16
    return x, w, mx, rx, my, ry


def check(fn, args, code):
    """fn(args, act=code) against fn(args) then the activation, in fp32: the activation is applied
    to the fp32 product before the output's rounding, with the last bits of libm's exp/tanh."""
    plain = fn(*args, 0).float()
    assert plain.abs().max() > 1 and (plain < 0).any() and (plain > 0).any()  # a meaningful range
    want = ACTIVATION_FNS[code](plain)
    got = fn(*args, code)
    assert got.dtype == args[0].dtype and got.shape == plain.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:  # bf16: rounded once (ours) or twice (the product, then the activation of it)
        torch.testing.assert_close(got.float(), want, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
def test_activation_applied(op, impl, act, rng):
    check(implementation(op, impl, "cpu"), inputs(op, rng), ACTIVATIONS[act])


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("op", OPS)
def test_activation_isa(cpu_isa, op, act, rng):
    fn = compiled_or_skip(op)
    with _testing.force_cpu_isa(cpu_isa):
        for dtype in (torch.float32, torch.bfloat16):
            check(fn, inputs(op, rng, dtype), ACTIVATIONS[act])


@pytest.mark.parametrize("impl", IMPLS)
def test_mm8_one_i16_fallback_path_activates(impl, rng):
    """x = 0 takes mm8_one's fp32 path (nothing to quantize): y = 0, so sigmoid gives 0.5 and silu 0."""
    fn = implementation("mm8_one_i16", impl, "cpu")
    x, *rest = inputs("mm8_one_i16", rng)
    zero = torch.zeros_like(x)
    torch.testing.assert_close(fn(zero, *rest, ACTIVATIONS["sigmoid"]), torch.full((M,), 0.5))
    torch.testing.assert_close(fn(zero, *rest, ACTIVATIONS["silu"]), torch.zeros(M))


@pytest.mark.parametrize("op", OPS)
def test_activation_opcheck(op, rng):
    compiled_or_skip(op)
    torch.library.opcheck(getattr(torch.ops.rwkv, op).default, (*inputs(op, rng), ACTIVATIONS["tanh"]))


@pytest.mark.parametrize("act", [-1, 5])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
def test_activation_code_out_of_range(op, impl, act, rng):
    fn = implementation(op, impl, "cpu")
    with pytest.raises(RuntimeError, match=rf"{op}: act must be 0 \(none\), 1 \(sigmoid\), 2 \(relu squared\), "
                                           rf"3 \(tanh\) or 4 \(silu\), got {act}"):
        fn(*inputs(op, rng), act)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_linear_one_activation_cuda(act, rng):
    """CUDA linear_one (bf16) applies the activation too: the same check as on CPU."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    fn = compiled_or_skip("linear_one", "cuda")
    x, w = inputs("linear_one", rng, torch.bfloat16)
    check(fn, (x.cuda(), w.cuda()), ACTIVATIONS[act])


@pytest.mark.parametrize("op", OPS)
def test_relu_squared_special_values(cpu_isa, op, rng):
    """Relu squared of NaN, infinities and negative values as torch's relu(y)**2 gives them (NaN
    stays NaN), in the vector part of the loop and in its tail (M = 70 columns). The special
    outputs come from one weight row times x = e_0 (linear_one) or from the column offsets mx,
    which the product adds times sum(x) ~ 1 (mm8_one_i16)."""
    fn = compiled_or_skip(op)
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.5, -0.5, 2.0, -3.0])
    column = special[torch.arange(M) % len(special)]
    with _testing.force_cpu_isa(cpu_isa):
        if op == "linear_one":
            x, w = test_linear_one.make_inputs(N, M, rng, dtype=torch.float32)
            x = torch.zeros_like(x)
            x[0] = 1.0
            w = w.clone()
            w[0] = column
            args = (x, w)
        else:
            x, w, _, rx, my, ry = inputs(op, rng)
            args = (x, w, column, rx, my, ry)
        plain = fn(*args, 0)
        assert plain.isnan().any() and (plain == float("inf")).any() and (plain == float("-inf")).any()
        assert (plain.nan_to_num() < 0).sum() > M // 4
        got = fn(*args, ACTIVATIONS["relu2"])
        torch.testing.assert_close(got, ACTIVATION_FNS[ACTIVATIONS["relu2"]](plain), equal_nan=True,
                                   rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_activate_in_place_gives_the_same_bits(act, dtype):
    """activate_ (the models' sequence products, activated in the product's own memory) gives
    activate's bits, NaN, infinities and signed zeros included, and returns the tensor it wrote."""
    g = torch.Generator().manual_seed(7)
    y = (torch.randn(37, 301, generator=g) * 12).to(dtype)
    y[0, :6] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1e-30])
    want = ref.activate(y, ACTIVATIONS[act])
    mine = y.clone()
    got = ref.activate_(mine, ACTIVATIONS[act])
    assert got.data_ptr() == mine.data_ptr()
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits))
    assert not torch.equal(got.view(bits), y.view(bits))  # it did change the values
