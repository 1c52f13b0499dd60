"""rwkv/hugepages.py: CPU weights moved into one mapping advised MADV_HUGEPAGE keep their values,
shapes and strides; the advice is really on the mapping (VmFlags "hg"); the mapping is then
collapsed into huge pages (MADV_COLLAPSE) over whole huge pages covering every moved tensor, and
collapsing really backs 4 KiB pages with huge ones; the switch turns it off; and a model loads to
the same logits either way."""

import mmap

import pytest
import torch

from rwkv import hugepages
from rwkv.model import RWKV
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

needs_thp = pytest.mark.skipif(not hugepages.available(), reason="no transparent huge pages on this OS")


def smaps_field(addr: int, field: str) -> list[str]:
    """The values of a field of /proc/self/smaps for the mapping that contains addr."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == field + ":":
                return line.split()[1:]
    raise AssertionError(f"no mapping contains {addr:#x}")


def vma_flags(addr: int) -> list[str]:
    return smaps_field(addr, "VmFlags")


def mapping_kb(addr: int, field: str) -> int:
    return int(smaps_field(addr, field)[0])


def sample_weights():
    g = torch.Generator().manual_seed(3)
    return {
        "dense": torch.randn(300, 700, generator=g),
        "colmajor": torch.randint(0, 256, (900, 3000), generator=g, dtype=torch.uint8).t(),  # [3000, 900]
        "bf16": torch.randn(5, 2049, generator=g).to(torch.bfloat16),
        "strided": torch.randn(40, 40, generator=g)[:, ::2],  # neither layout: left alone
        "vector": torch.randn(7, generator=g),
    }


@needs_thp
def test_pack_keeps_values_shapes_and_strides():
    w = sample_weights()
    before = {k: (v.clone(), v.shape, v.stride(), v.data_ptr()) for k, v in w.items()}
    moved = hugepages.pack(w, list(w))
    assert moved >= sum(v[0].numel() * v[0].element_size() for k, v in before.items() if k != "strided")
    for k, (values, shape, stride, ptr) in before.items():
        assert torch.equal(w[k], values), k
        assert w[k].shape == shape and w[k].stride() == stride and w[k].dtype == values.dtype, k
        assert (w[k].data_ptr() == ptr) == (k == "strided"), k
    for k in ("dense", "colmajor", "bf16", "vector"):
        assert "hg" in vma_flags(w[k].data_ptr()), k  # MADV_HUGEPAGE is set on the mapping
        assert w[k].data_ptr() % 64 == 0, k
    w["dense"].add_(1)  # the moved tensors are ordinary writable tensors
    assert torch.equal(w["dense"], before["dense"][0] + 1)


@needs_thp
def test_pack_collapses_whole_huge_pages_over_every_tensor(monkeypatch):
    calls = []
    monkeypatch.setattr(hugepages, "collapse", lambda addr, n: calls.append((addr, n)) or True)
    w = sample_weights()
    hugepages.pack(w, list(w))
    assert len(calls) == 1
    addr, n = calls[0]
    assert addr % hugepages.HUGE_PAGE == 0 and n % hugepages.HUGE_PAGE == 0 and n > 0
    for k in ("dense", "colmajor", "bf16", "vector"):
        t = w[k]
        first = t.data_ptr()
        last = first + (t.numel() - 1) * t.element_size()  # these are dense: no gaps
        assert addr <= first and last < addr + n, k


@needs_thp
def test_collapse_backs_4k_pages_with_huge_pages():
    """Memory faulted in 4 KiB pages (no MADV_HUGEPAGE advice; THP mode "madvise") is backed by
    huge pages after collapse(), where the kernel offers MADV_COLLAPSE (Linux 6.1+)."""
    size = 8 * hugepages.HUGE_PAGE
    buf = mmap.mmap(-1, size + hugepages.HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = torch.frombuffer(buf, dtype=torch.uint8)
    start = (-base.data_ptr()) % hugepages.HUGE_PAGE
    region = base[start:start + size]
    region.fill_(7)
    addr = region.data_ptr()
    if mapping_kb(addr, "AnonHugePages") >= size // 1024:
        pytest.skip("the faults already got huge pages (THP mode \"always\")")
    if not hugepages.collapse(addr, size):
        pytest.skip("MADV_COLLAPSE is unavailable (Linux < 6.1) or was refused")
    assert mapping_kb(addr, "AnonHugePages") >= size // 1024
    assert bool((region == 7).all())  # the same contents


def test_switch_off(monkeypatch):
    monkeypatch.setenv("RWKV_CPU_HUGEPAGES", "0")
    assert not hugepages.available()
    w = sample_weights()
    ptrs = {k: v.data_ptr() for k, v in w.items()}
    assert hugepages.pack(w, list(w)) == 0
    assert all(w[k].data_ptr() == p for k, p in ptrs.items())


@needs_thp
def test_model_weights_packed_and_logits_unchanged(tmp_path, monkeypatch):
    path = str(save_checkpoint(tmp_path / "v7.pth", make_checkpoint("7", n_layer=2, n_embd=128, vocab=300,
                                                                    head_size=64, seed=5)))
    for strategy in ("cpu fp32", "cpu fp32i8", "cpu bf16"):
        monkeypatch.setenv("RWKV_CPU_HUGEPAGES", "1")
        packed = RWKV(path, strategy, verbose=False)
        key = "blocks.0.att.key.weight"
        assert "hg" in vma_flags(packed.w[key].data_ptr()), strategy
        monkeypatch.setenv("RWKV_CPU_HUGEPAGES", "0")
        plain = RWKV(path, strategy, verbose=False)
        assert "hg" not in vma_flags(plain.w[key].data_ptr()), strategy
        for tokens in ([1, 2, 3], [4]):
            a, b = packed.forward(tokens, None)[0], plain.forward(tokens, None)[0]
            assert torch.equal(a, b), strategy


@needs_thp
def test_mapping_refused_leaves_weights_alone(monkeypatch):
    # A failed mmap (e.g. overcommit refused for a huge model) keeps the weights where they are.
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(hugepages.mmap, "mmap", refuse)
    w = sample_weights()
    ptrs = {k: v.data_ptr() for k, v in w.items()}
    assert hugepages.pack(w, list(w)) == 0
    assert all(w[k].data_ptr() == p for k, p in ptrs.items())
