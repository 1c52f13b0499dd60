"""Row slabs (rwkv/slabs.py): how many slabs a matrix gets, which matrices are split, that the
split layout holds the same values slab by slab, that huge-page packing keeps it, and that a model
whose CPU matrices are split gives the logits and states of the same model unsplit (the product is
linear in the rows; only the summation order changes). Int8 slabs against upstream itself:
tests/test_compat_upstream.py."""

import pytest
import torch

from rwkv import hugepages, slabs
from rwkv.model import RWKV
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint


@pytest.mark.parametrize("n, rows, expected", [
    (4096, 4096, 1), (100, 4096, 1), (8192, 4096, 2), (16384, 4096, 4),
    (10240, 4096, 4),   # 3 slabs would be 3413.3 rows: the next count that splits evenly
    (12288, 4096, 3), (8256, 4096, 3),  # 8256 = 3 * 2752 = 3 * 43 * 64
    (8200, 4096, 1),    # not a multiple of 64: no even split into multiples of 64
    (512, 64, 8), (300, 64, 1),
])
def test_slab_count(n, rows, expected):
    s = slabs.slab_count(n, rows)
    assert s == expected
    if s > 1:
        assert n % s == 0 and (n // s) % 64 == 0 and n // s <= rows


def test_split_rows_layout():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 256, (300, 384), generator=g, dtype=torch.uint8).t()  # [384, 300] column-major
    s = slabs.split_rows(q, 3)
    assert s.shape == (3, 128, 300) and s.stride() == (128 * 300, 1, 128)
    assert torch.equal(s.reshape(384, 300), q)
    for i in range(3):
        assert s[i].t().is_contiguous()                     # each slab is a column-major matrix
        assert s[i].data_ptr() == s.data_ptr() + i * 128 * 300  # slabs one after another
        assert torch.equal(s[i], q[i * 128:(i + 1) * 128])


@pytest.mark.parametrize("dtype, rows, expected", [
    (torch.uint8, 8192, 2), (torch.uint8, 4096, 1), (torch.bfloat16, 8192, 4), (torch.float32, 8192, 4),
    (torch.float32, 2048, 1), (torch.float16, 8192, 1),  # no fp16 CPU kernel: left alone
])
def test_for_decode_splits_by_activation_size(dtype, rows, expected):
    w = torch.zeros(128, rows, dtype=dtype).t()  # [rows, 128] column-major
    out = slabs.for_decode(w)
    assert (out.shape[0] if out.dim() == 3 else 1) == expected
    assert slabs.for_decode(torch.zeros(rows, 128, dtype=dtype)).dim() == 2  # row-major: left alone


@pytest.mark.skipif(not hugepages.available(), reason="no transparent huge pages on this OS")
def test_split_rows_packed_into_huge_pages():
    q = torch.randint(0, 256, (64, 256), dtype=torch.uint8).t()
    w = {"s": slabs.split_rows(q, 2)}
    before = w["s"].clone()
    assert hugepages.pack(w, ["s"]) > 0
    assert w["s"].stride() == before.stride() and torch.equal(w["s"], before)


def _run(path, strategy, **kw):
    m = RWKV(path, strategy, verbose=False, **kw)
    out, state = [], None
    for tokens in ([3, 1, 4, 1, 5, 9, 2, 6], [5], [3, 5], [8]):
        logits, state = m.forward(tokens, state)
        out.append((logits.clone(), [t.clone() for t in state]))
    return m, out


@pytest.mark.parametrize("version, strategy, kernels", [
    ("4", "cpu fp32i8", "auto"), ("5.2", "cpu bf16i8", "auto"), ("6", "cpu fp32i8", "reference"),
    ("7", "cpu fp32i8", "auto"), ("7", "cpu bf16 *1 -> cpu fp32i8", "auto"),
    ("4", "cpu fp32", "auto"), ("6", "cpu bf16", "auto"), ("7", "cpu fp32", "reference"), ("5.2", "cpu bf16", "auto"),
])
def test_split_model_matches_unsplit(tmp_path, monkeypatch, version, strategy, kernels):
    # exact_int8: fp32 products throughout, so splitting changes only the summation order (the
    # default int16 activation gets one scale per slab instead of one per matrix; that path is
    # checked against upstream in tests/test_compat_upstream.py).
    path = str(save_checkpoint(tmp_path / "m.pth", make_checkpoint(version, n_layer=2, n_embd=128, vocab=300,
                                                                   head_size=64, seed=11)))
    _, whole = _run(path, strategy, kernels=kernels, exact_int8=True)
    # Every matrix in slabs of 64 rows (the 128-row ones in 2): 128 bytes of int16, 256 of fp32.
    monkeypatch.setattr(slabs, "SLAB_BYTES", 128 if "i8" in strategy else 256)
    m, split = _run(path, strategy, kernels=kernels, exact_int8=True)
    for key in ("blocks.1.att.key.weight", "blocks.1.ffn.value.weight", "head.weight"):
        assert m.w[key].dim() == 3 and m.w[key].shape[1] == 64, key
    bf16 = "bf16" in strategy
    for n, ((a, sa), (b, sb)) in enumerate(zip(split, whole)):
        # fp32: reordered fp32 sums (~1e-6 of magnitude ~3); bf16: the split sums differently
        # rounded (linear_one_slabs rounds the fp32 sum once; other paths round each slab's
        # product to bf16 first), a few bf16 ulps per layer.
        tol = 0.05 * float(b.abs().max()) if bf16 else 1e-4
        assert float((a - b).abs().max()) <= tol, f"call {n} logits"
        for i, (x, y) in enumerate(zip(sa, sb)):
            assert float((x.float() - y.float()).abs().max()) <= max(tol, 1e-4 * float(y.abs().max())), \
                f"call {n} state[{i}]"
