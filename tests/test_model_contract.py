"""The forward contract: shapes, state semantics, bad input, conversion, state tuning, kernel modes."""

import copy

import numpy as np
import pytest
import torch

from rwkv.loading import CheckpointError
from rwkv.model import RWKV, StateError, TokenError, convert_checkpoint
from rwkv.strategy import StrategyError
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

CFG = dict(n_layer=2, n_embd=64, vocab=100, head_size=32, seed=3)
VERSIONS = ("4", "5.0", "5.1", "5.2", "6", "7")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("contract")
    return {v: str(save_checkpoint(d / f"v{v}.pth", make_checkpoint(v, **CFG))) for v in VERSIONS}


@pytest.fixture(scope="module")
def models(paths):
    return {v: RWKV(p, "cpu fp32", verbose=False) for v, p in paths.items()}


def _clone(state):
    return [t.clone() for t in state]


@pytest.mark.parametrize("v", VERSIONS)
def test_shapes_and_dtypes(models, v):
    m = models[v]
    out, st = m.forward([1, 2, 3], None)
    assert out.shape == (100,) and out.dtype == torch.float32
    full, _ = m.forward([1, 2, 3], None, full_output=True)
    assert full.shape == (3, 100)
    torch.testing.assert_close(full[-1], out, rtol=1e-5, atol=1e-5)  # BLAS: 3-row vs 1-row product
    one, _ = m.forward([1], None, full_output=True)
    assert one.shape == (100,)  # upstream: one token + full_output gives (V), not (1, V)
    per = 5 if v == "4" else 3
    assert len(st) == 2 * per


@pytest.mark.parametrize("v", VERSIONS)
def test_accepts_lists_arrays_tensors_and_ints(models, v):
    m = models[v]
    ref, _ = m.forward([5], None)
    for tokens in ([5], np.array([5]), torch.tensor([5]), 5, np.int64(5)):
        out, _ = m.forward(tokens, None)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("v", VERSIONS)
def test_chunked_equals_whole(models, v):
    m = models[v]
    whole, s_whole = m.forward(list(range(1, 9)), None)
    out, st = m.forward([1, 2, 3], None)
    out, st = m.forward([4], st)
    out, st = m.forward([5, 6, 7, 8], st)
    # 5.0/5.1 differ in the last bits only through summation order; everything else is the same math.
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)
    for a, b in zip(st, s_whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("v", VERSIONS)
def test_state_semantics_and_snapshots(models, v):
    m = models[v]
    _, st = m.forward([1, 2], None)
    snapshot_list = list(st)  # shallow copy: must be a true snapshot (tensors are never written)
    values = _clone(st)
    out, st2 = m.forward([3], st)
    for a, b in zip(snapshot_list, values):
        assert torch.equal(a, b)
    if v == "7":
        assert st2 is not st and all(a is b for a, b in zip(st, snapshot_list))  # v7: caller's list untouched
    else:
        assert st2 is st  # classic: upstream mutates the caller's list in place and returns it
    again, _ = m.forward([3], snapshot_list)
    assert torch.equal(again, out)


@pytest.mark.parametrize("bad,match", [([], "empty"), ([100], "out of range"), ([-1], "out of range"),
                                       ([2 ** 70], "out of range"), ([5, -2 ** 70], "out of range"),
                                       (np.array([100]), "out of range"), (torch.tensor([-1]), "out of range"),
                                       ([1.5], "must be an int"), (["a"], "must be an int"),
                                       (torch.tensor([[1, 2]]), "1-D"), (torch.tensor([1.0]), "integer"),
                                       ([True], "must be an int"), (None, "list of token ids")])
def test_bad_tokens_raise_and_leave_state_alone(models, bad, match):
    m = models["6"]
    _, st = m.forward([1], None)
    before = _clone(st)
    ids = [id(t) for t in st]
    with pytest.raises(TokenError, match=match):
        m.forward(bad, st)
    assert [id(t) for t in st] == ids and all(torch.equal(a, b) for a, b in zip(st, before))


def test_token_errors_are_index_errors_too(models):
    # Upstream raised IndexError for empty lists and out-of-range ids; old code catching it still works.
    with pytest.raises(IndexError):
        models["4"].forward([], None)


def test_state_from_another_model_is_refused(models):
    _, st_v6 = models["6"].forward([1], None)
    _, st_v4 = models["4"].forward([1], None)
    with pytest.raises(StateError, match="entries, this model needs"):
        models["6"].forward([1], st_v4)
    bad = _clone(st_v6)
    bad[1] = torch.zeros(4, 16, 16)
    with pytest.raises(StateError, match=r"state\[1\] .*shape"):
        models["6"].forward([1], bad)
    bad = _clone(st_v6)
    bad[0] = bad[0].to(torch.float64)
    with pytest.raises(StateError, match="dtype"):
        models["6"].forward([1], bad)
    with pytest.raises(StateError, match="must be None or the list"):
        models["6"].forward([1], "state")
    # A state from the same architecture but another model (different head layout) is refused too.
    _, st_v7 = models["7"].forward([1], None)
    wrong = _clone(st_v7)
    wrong[1] = torch.zeros(1, 64, 64)
    with pytest.raises(StateError, match="different model"):
        models["7"].forward([1], wrong)


def test_deepcopy_of_state_and_logits(models):
    out, st = models["5.2"].forward([1, 2], None)
    st2 = copy.deepcopy(st)
    out2 = copy.deepcopy(out)
    out2[0] = -float("inf")  # clients edit logits in place
    a, _ = models["5.2"].forward([3], st)
    b, _ = models["5.2"].forward([3], st2)
    assert torch.equal(a, b)


@pytest.mark.parametrize("strategy,match", [("cpu fp8", "dtype"), ("gpu fp32", "device"), ("cpu fp32i4", "i8"),
                                            ("dml fp32", "DirectML"), ("", "empty")])
def test_bad_strategy(paths, strategy, match):
    with pytest.raises(StrategyError, match=match):
        RWKV(paths["4"], strategy, verbose=False)


def test_unavailable_device_is_a_clear_error(paths, tmp_path):
    from rwkv.model import DeviceUnavailableError
    with pytest.raises(DeviceUnavailableError, match=r"cuda:99"):
        RWKV(paths["4"], "cpu fp32 *1 -> cuda:99 fp16", verbose=False)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="use a 'cpu ...' strategy"):
            RWKV(paths["4"], "cuda fp16", verbose=False)
    # Converting for a GPU strategy needs no GPU (upstream's convert_model.py works the same way).
    out = convert_checkpoint(paths["4"], "cuda fp16i8 *1 -> cuda fp16", str(tmp_path / "gpu"))
    assert torch.load(out, weights_only=True)["_strategy"] == "cuda fp16i8 *1 -> cuda fp16"


def test_bad_kernels_keyword(paths):
    with pytest.raises(ValueError, match="kernels must be one of"):
        RWKV(paths["4"], "cpu fp32", verbose=False, kernels="fast")


@pytest.mark.parametrize("v", VERSIONS)
def test_reference_and_compiled_kernels_agree(paths, v):
    from rwkv import ops
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    for strategy in ("cpu fp32", "cpu fp32i8"):
        ref = RWKV(paths[v], strategy, verbose=False, kernels="reference")
        # exact_int8: one-token int8 products in fp32 like the reference (the default rounds the
        # activation to int16; test_exact_int8_switch covers that path).
        fast = RWKV(paths[v], strategy, verbose=False, kernels="compiled", exact_int8=True)
        a, sa = ref.forward([1, 2, 3, 4], None)
        b, sb = fast.forward([1, 2, 3, 4], None)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        a, _ = ref.forward([5], sa)
        b, _ = fast.forward([5], sb)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("v,key", [("6", "blocks.1.att.time_decay_w1"), ("6", "blocks.0.att.time_maa_w1"),
                                   ("7", "blocks.1.att.v2"), ("7", "blocks.0.att.w1")])
def test_low_rank_factors_are_column_major_on_cpu(paths, v, key):
    """bf16 and fp32 low-rank factors are re-laid column-major on CPU (same values) so that
    one-token products use the linear_one kernel."""
    from rwkv import ops
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    bf16 = RWKV(paths[v], "cpu bf16", verbose=False)
    fp32 = RWKV(paths[v], "cpu fp32", verbose=False)
    assert bf16.w[key].t().is_contiguous() and fp32.w[key].t().is_contiguous()
    assert torch.equal(bf16.w[key], fp32.w[key].to(torch.bfloat16))
    layer, name = int(key.split(".")[1]), key.split(".")[-1]
    attr = {"time_decay_w1": "decay_w1", "time_maa_w1": "maa_w1"}.get(name, name)
    for m in (bf16, fp32):
        assert getattr(m._rt.att[layer], attr)._dense_one is not None


@pytest.mark.parametrize("v", VERSIONS)
def test_exact_int8_switch(paths, v, monkeypatch):
    from rwkv import ops
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    fp32 = RWKV(paths[v], "cpu fp32", verbose=False)
    exact = RWKV(paths[v], "cpu fp32i8", verbose=False, exact_int8=True)
    fast = RWKV(paths[v], "cpu fp32i8", verbose=False)
    monkeypatch.setenv("RWKV_EXACT_INT8", "1")
    from_env = RWKV(paths[v], "cpu fp32i8", verbose=False)
    assert (fast.exact_int8, exact.exact_int8, from_env.exact_int8) == (False, True, True)
    _, s = fp32.forward([1, 2, 3], None)
    a, b, c, e = (m.forward([5], list(s))[0] for m in (fp32, exact, fast, from_env))  # v4-v6 replace list items
    assert torch.equal(b, e)
    # The default differs from fp32 arithmetic (the switch switches) by far less than int8
    # quantization moves the logits (5%: tests/test_compat_upstream.py explains the figure).
    diff, quant = float((c - b).abs().max()), float((b - a).abs().max())
    assert 0 < diff <= 0.05 * quant, (diff, quant)
    with pytest.raises(TypeError, match="exact_int8 must be True, False or None"):
        RWKV(paths[v], "cpu fp32i8", verbose=False, exact_int8="yes")


@pytest.mark.parametrize("v", VERSIONS)
@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8"])
def test_grouped_products_equal_separate_products(paths, v, strategy):
    """One-token decode puts each layer's independent products into linear_one_group calls, a
    group with the second factors of its low-rank products (RWKV-6's decay, RWKV-7's) into one
    linear_one_chain call, and a channel mix's group with its value product into one linear_one_ffn
    call; the logits and state are those of the separate product calls, bit for bit."""
    from rwkv import ops
    from rwkv.models.common import ProjectionChain, ProjectionGroup
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])

    def members(model, kind):
        return [g for m in model._rt.att + model._rt.ffn for g in vars(m).values() if isinstance(g, kind)]

    # (Op by op: the step plans, tests/test_step_plan.py, call the kernels from C++.)
    grouped = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    separate = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    groups, chains = members(separate, ProjectionGroup), members(separate, ProjectionChain)
    assert len(groups) == (3 if v == "7" else 2) * CFG["n_layer"] and all(g.op is not None for g in groups)
    assert len(chains) == (CFG["n_layer"] if v in ("6", "7") else 0) and all(c.op is not None for c in chains)
    assert all(f.one_op is not None for f in separate._rt.ffn)
    for g in groups + chains + [c.second for c in chains]:
        g.op = None
    for f in separate._rt.ffn:
        f.one_op = None
    calls = []
    for kind, name in ((ProjectionGroup, "linear_one_group"), (ProjectionChain, "linear_one_chain")):
        for g in members(grouped, kind):
            g.op = lambda *args, _op=ops.resolve(name, "cpu"): calls.append(1) or _op(*args)
    for f in grouped._rt.ffn:
        f.one_op = lambda *args, _op=ops.resolve("linear_one_ffn", "cpu"): calls.append(1) or _op(*args)
    _, s = grouped.forward([1, 2, 3], None)
    a, sa = grouped.forward([5], _clone(s))
    b, sb = separate.forward([5], _clone(s))
    joined = {id(g) for c in chains for g in (c.first, c.second)} | {id(f.rk) for f in separate._rt.ffn}
    # every group made its one call, a chain's two groups one call together, a channel mix's
    # group one call with its value product
    assert len(calls) == sum(id(g) not in joined for g in groups) + len(chains) + CFG["n_layer"]
    assert torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))


@pytest.mark.parametrize("v", ["4", "7"])  # (3.5x FFNs here, 224 rows, have no 64-row slabs)
@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8"])
def test_slab_products_are_one_linear_one_slabs_call(paths, monkeypatch, v, strategy):
    """One-token products of matrices kept in row slabs are one linear_one_slabs call each (or one
    linear_one_residual or linear_one_ffn call, which compute the same product and add the
    residual), with the results of one product per slab summed in fp32 (bit for bit with fp32
    activations; bf16 now rounds the sum once instead of each slab's product)."""
    from rwkv import ops, slabs
    from rwkv.models.common import Projection, projections
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    monkeypatch.setattr(slabs, "SLAB_BYTES", 256)  # the 256-row FFN value matrices: 2 or 4 slabs
    fused = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    per_slab = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    split = [p for m in per_slab._rt.att + per_slab._rt.ffn for p in projections(m) if p.slabs is not None]
    assert split and all(p._slabs_one is not None for p in split)
    for p in split:
        p._slabs_one = p._residual_one = None  # the slab-by-slab path, then torch's add
    for f in per_slab._rt.ffn:
        f.one_op = None
    calls = []
    for p in (p for m in fused._rt.att + fused._rt.ffn for p in projections(m) if p.slabs is not None):
        for attr, name in (("_slabs_one", "linear_one_slabs"), ("_residual_one", "linear_one_residual")):
            setattr(p, attr, lambda *args, _op=ops.resolve(name, "cpu"): calls.append(1) or _op(*args))
    for f in (f for f in fused._rt.ffn if f.value.slabs is not None):
        f.one_op = lambda *args, _op=ops.resolve("linear_one_ffn", "cpu"): calls.append(1) or _op(*args)
    _, s = fused.forward([1, 2, 3], None)
    a, sa = fused.forward([5], _clone(s))
    b, sb = per_slab.forward([5], _clone(s))
    assert len(calls) == len(split)
    if "bf16" in strategy:
        assert float((a - b).abs().max()) <= 0.05 * float(b.abs().max())
    else:
        assert torch.equal(a, b)
        assert all(torch.equal(x, y) for x, y in zip(sa, sb))


@pytest.mark.parametrize("v", VERSIONS)
@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8"])
def test_residual_adds_in_the_products_equal_torch_adds(paths, v, strategy):
    """One-token decode adds each block's residual (and the FFN's gate, v4-v6) in the output and
    FFN value products' linear_one_residual calls; the logits and state are those of the product
    followed by torch's add (and mul), bit for bit."""
    from rwkv import ops
    from rwkv.models.common import projections
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    fused = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    separate = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    for p in (p for m in separate._rt.att + separate._rt.ffn for p in projections(m)):
        assert p._residual_one is not None
        p._residual_one = None
    for f in separate._rt.ffn:  # (linear_one_ffn adds the FFN's residual itself)
        f.one_op = None
    calls = []
    real = ops.resolve("linear_one_residual", "cpu")
    for p in (p for m in fused._rt.att + fused._rt.ffn for p in projections(m)):
        p._residual_one = lambda *args, _op=real: calls.append(1) or _op(*args)
    for f in fused._rt.ffn:
        f.one_op = lambda *args, _op=ops.resolve("linear_one_ffn", "cpu"): calls.append(1) or _op(*args)
    _, s = fused.forward([1, 2, 3], None)
    a, sa = fused.forward([5], _clone(s))
    b, sb = separate.forward([5], _clone(s))
    assert len(calls) == 2 * CFG["n_layer"]  # each layer's output product and channel mix
    assert torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))


@pytest.mark.parametrize("v", VERSIONS)
@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8"])
def test_split_mix_ops_equal_stacked_mixes(paths, v, strategy):
    """On CPU each block half begins with ln_mix_split (and RWKV-6's time mix goes on with
    maa_mix_split, for one token maa_lora_one: its first low-rank product inside), whose results
    are separate tensors; the logits and state, of a prompt and of one token, are those of ln_mix,
    RWKV-6's linear_one and maa_mix with their results split by views, bit for bit."""
    from rwkv import ops
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    split = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    stacked = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    calls = []
    for m in stacked._rt.att + stacked._rt.ffn:
        assert m.ln_mix.split_op is not None and m.ln_mix.op is not None
        m.ln_mix.split_op = None
        if v == "6" and hasattr(m, "maa_split"):
            assert m.maa_split is not None and m.maa_lora is not None
            m.maa_split = m.maa_lora = None
    for m in split._rt.att + split._rt.ffn:
        m.ln_mix.split_op = lambda *args, _op=ops.resolve("ln_mix_split", "cpu"): calls.append(1) or _op(*args)
        if hasattr(m, "maa_split"):
            m.maa_split = lambda *args, _op=ops.resolve("maa_mix_split", "cpu"): calls.append(1) or _op(*args)
            m.maa_lora = lambda *args, _op=ops.resolve("maa_lora_one", "cpu"): calls.append(1) or _op(*args)
    a0, sa = split.forward([1, 2, 3], None)
    b0, sb = stacked.forward([1, 2, 3], None)
    a, sa = split.forward([5], _clone(sa))
    b, sb = stacked.forward([5], _clone(sb))
    # two forward calls, each with two ln_mix_split calls per layer (and RWKV-6's maa_mix_split
    # for the prompt, maa_lora_one for the token)
    assert len(calls) == 2 * (3 if v == "6" else 2) * CFG["n_layer"]
    assert torch.equal(a0, b0) and torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5])
def test_head_norm_matches_torch_layer_norm(dtype, T):
    """The head's layer norm (ln_out) on CPU is the compiled ln_mix_split with no mixes: torch's
    layer_norm up to float rounding (another summation order for the mean and variance; bf16
    results at most one bf16 step apart), for C not a multiple of the vector width."""
    from rwkv import ops
    from rwkv.models.common import LAYER_NORM_EPS, HeadNorm
    from rwkv.strategy import plan_layers
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    C = 100
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(C, generator=g).to(dtype), torch.randn(C, generator=g).to(dtype)
    x = (torch.randn(T, C, generator=g) * 3 + 1).to(dtype)
    dd = plan_layers("cpu fp32" if dtype == torch.float32 else "cpu bf16", 1)[1]
    hn = HeadNorm(w, b, dd, "auto")
    assert hn.op is not None
    y = hn(x)
    want = torch.nn.functional.layer_norm(x, (C,), weight=w, bias=b, eps=LAYER_NORM_EPS)
    assert y.shape == want.shape and y.dtype == dtype
    step = 1e-5 if dtype == torch.float32 else 2.0 ** -7
    assert ((y.float() - want.float()).abs() <= step * want.float().abs() + 1e-5).all()
    assert HeadNorm(w, b, dd, "reference").op is None  # kernels="reference": torch's layer_norm


@pytest.mark.parametrize("v", VERSIONS)
@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu fp32i8", "cpu bf16", "cpu bf16i8"])
def test_head_norm_op_equals_torch_in_the_model(paths, v, strategy):
    """The model's logits with the head's layer norm as the compiled op (one call per forward, a
    prompt's and a token's) are those with torch's layer_norm up to float rounding; the state,
    which the head does not touch, is the same bits."""
    from rwkv import ops
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    fused = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    torch_ln = RWKV(paths[v], strategy, verbose=False, cpu_plan=False)
    calls = []
    real = fused._rt.head_norm.op
    assert real is not None
    fused._rt.head_norm.op = lambda *args: calls.append(1) or real(*args)
    torch_ln._rt.head_norm.op = None
    a0, sa = fused.forward([1, 2, 3], None)
    b0, sb = torch_ln.forward([1, 2, 3], None)
    a, sa = fused.forward([5], _clone(sa))
    b, sb = torch_ln.forward([5], _clone(sb))
    assert len(calls) == 2
    step = 1e-5 if "bf16" not in strategy else 2.0 ** -7  # of the largest logit
    for x, y in ((a0, b0), (a, b)):
        assert (x - y).abs().max() <= step * y.abs().max()
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))


def test_verbose_plan_names_the_int8_decode_op(paths, capsys):
    from rwkv import ops
    if "compiled" not in ops.backend_report().splitlines()[0]:
        pytest.skip("rwkv._C is not built: " + ops.backend_report().splitlines()[0])
    RWKV(paths["4"], "cpu fp32 *1 -> cpu fp32i8", verbose=True)
    out = capsys.readouterr().out
    assert "layer 0                cpu fp32  wkv4_forward=compiled(cpu)\n" in out
    assert "cpu fp32 i8  wkv4_forward=compiled(cpu)  int8 decode=mm8_one_i16\n" in out
    RWKV(paths["4"], "cpu fp32i8", verbose=True, exact_int8=True)
    assert "int8 decode=mm8_one\n" in capsys.readouterr().out


@pytest.mark.parametrize("v", VERSIONS)
def test_convert_roundtrip_every_version(paths, tmp_path, v):
    # Upstream's converted v6 files lose n_head and crash; ours (and v7) load.
    strategy = "cpu fp32 *1 -> cpu fp32i8"
    out = convert_checkpoint(paths[v], strategy, str(tmp_path / f"conv{v}"))
    assert out.endswith(".pth")
    direct = RWKV(paths[v], strategy, verbose=False)
    conv = RWKV(out, strategy, verbose=False)
    a, _ = direct.forward([1, 2, 3], None)
    b, _ = conv.forward([1, 2, 3], None)
    assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match="can only be loaded with exactly"):
        RWKV(out, "cpu fp32", verbose=False)


def test_convert_and_save_and_exit_exits_like_upstream(paths, tmp_path):
    with pytest.raises(SystemExit) as e:
        RWKV(paths["4"], "cpu fp32i8", verbose=False, convert_and_save_and_exit=str(tmp_path / "c"))
    assert e.value.code == 0 and (tmp_path / "c.pth").exists()


def test_rescale_layer_keeps_the_function(paths):
    a = RWKV(paths["5.2"], "cpu fp32", verbose=False, rescale_layer=0)
    b = RWKV(paths["5.2"], "cpu fp32", verbose=False, rescale_layer=1)
    assert b.RESCALE_LAYER == 1 and a.RESCALE_LAYER == 0
    la, _ = a.forward([1, 2, 3], None)
    lb, _ = b.forward([1, 2, 3], None)
    torch.testing.assert_close(la, lb, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("v", ("5.2", "6", "7"))
def test_state_tuning_file(paths, tmp_path, v):
    m = RWKV(paths[v], "cpu fp32", verbose=False)
    H, N = m.info.n_head, m.info.head_size
    g = torch.Generator().manual_seed(0)
    tuned = {f"blocks.{i}.att.time_state": torch.randn(H, N, N, generator=g) * 0.1 for i in range(2)}
    torch.save(tuned, tmp_path / "state.pth")
    plain, _ = m.forward([1, 2], None)
    m.load_state_tuning(str(tmp_path / "state.pth"))
    st = m.generate_zero_state()
    expected = tuned["blocks.0.att.time_state"]
    expected = expected if v == "7" else expected.transpose(1, 2)
    assert torch.equal(st[1], expected)
    tuned_out, _ = m.forward([1, 2], None)
    assert not torch.equal(plain, tuned_out)
    # The merged-into-the-checkpoint route (rwkv_state_merger.py) gives the same initial state.
    sd = make_checkpoint(v, **CFG)
    sd.update(tuned)
    merged = RWKV(str(save_checkpoint(tmp_path / "merged.pth", sd)), "cpu fp32", verbose=False)
    merged_out, _ = merged.forward([1, 2], None)
    torch.testing.assert_close(merged_out, tuned_out, rtol=1e-6, atol=1e-6)
    with pytest.raises(CheckpointError, match="expected"):
        m.load_state_tuning({f"blocks.{i}.att.time_state": torch.zeros(3, 3) for i in range(2)})


def test_env_vars_of_old_scripts_are_accepted(paths, monkeypatch):
    monkeypatch.setenv("RWKV_JIT_ON", "1")
    monkeypatch.setenv("RWKV_CUDA_ON", "1")
    monkeypatch.setenv("RWKV_V7_ON", "1")  # upstream: v4-v6 unloadable in this process; ours: harmless
    for v in ("4", "7"):
        out, _ = RWKV(paths[v], "cpu fp32", verbose=False).forward([1], None)
        assert torch.isfinite(out).all()


def test_upstream_attributes(models):
    m = models["5.2"]
    assert m.version == 5.2 and m.args.n_layer == 2 and m.args.n_head == 2
    assert m.args.strategy_string == "cpu fp32" and len(m.strategy) == 3
    assert m.strategy[2].atype == torch.float32 and m.strategy[2].device == "cpu"
    assert models["4"].version == 4 and not hasattr(models["4"].args, "n_head")
    assert m.w["blocks.0.att.time_decay"].dtype == torch.float32
