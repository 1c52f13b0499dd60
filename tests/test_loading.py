"""Checkpoint loading: path rules, safe unpickling, version detection, key/shape validation."""

import os
import pickle

import pytest
import torch

from rwkv.loading import CheckpointError, detect_version, inspect_checkpoint, read_checkpoint, resolve_path
from rwkv.model import RWKV
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint

CFG = dict(n_layer=2, n_embd=64, vocab=100, head_size=32, seed=1)


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    for v in ("4", "5.0", "5.1", "5.2", "6", "7"):
        save_checkpoint(d / f"v{v}.pth", make_checkpoint(v, **CFG))
    return d


@pytest.mark.parametrize("version,expected", [("4", 4), ("5.0", 5), ("5.1", 5.1), ("5.2", 5.2), ("6", 6), ("7", 7)])
def test_version_and_dimensions_detected_from_keys(version, expected):
    sd = make_checkpoint(version, **CFG)
    info = inspect_checkpoint(sd)
    assert info.version == expected
    assert (info.n_layer, info.n_embd, info.vocab_size) == (2, 64, 100)
    if expected != 4:
        assert info.n_head * info.head_size == 64
        assert info.head_size == (32 if expected in (5.2, 6, 7) else info.head_size)


def test_one_layer_v5_is_detected_unlike_upstream():
    # Upstream only sees 5.2's head count from block 1 and crashes on 1-layer models.
    sd = make_checkpoint("5.2", n_layer=1, n_embd=64, vocab=50, head_size=32)
    assert detect_version(sd) == 5.2
    assert inspect_checkpoint(sd).n_head == 2


def test_path_with_or_without_pth(ckpt_dir):
    assert resolve_path(str(ckpt_dir / "v4")) == str(ckpt_dir / "v4.pth")
    assert resolve_path(f"  {ckpt_dir / 'v4.pth'}  ") == str(ckpt_dir / "v4.pth")


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        RWKV(str(tmp_path / "nope"), "cpu fp32", verbose=False)


def test_directory_is_rejected(tmp_path):
    d = tmp_path / "dir.pth"
    d.mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        resolve_path(str(d))


@pytest.mark.parametrize("prefix", [b"", b"\x80\x02", b"\x80\x04\x95", b"PK\x03\x04"])
def test_garbage_file_is_a_clear_error(tmp_path, prefix):
    # Seeded garbage, some behind a pickle or zip header so the parsers get further: torch's
    # unpickler then raises IndexError, KeyError, ... which must all become CheckpointError.
    import random
    for seed in range(25):
        p = tmp_path / f"junk{seed}.pth"
        p.write_bytes(prefix + random.Random(seed).randbytes(4096))
        with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint|refused to load"):
            RWKV(str(p), "cpu fp32", verbose=False)


def test_truncated_checkpoint_is_a_clear_error(tmp_path, ckpt_dir):
    data = (ckpt_dir / "v4.pth").read_bytes()
    p = tmp_path / "cut.pth"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        read_checkpoint(str(p))


class _Exploit:
    """Unpickling this would create a marker file through os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.pth"
    torch.save({"emb.weight": torch.zeros(2, 2), "payload": _Exploit(marker)}, p)
    with pytest.raises(CheckpointError, match="refused to load"):
        RWKV(str(p), "cpu fp32", verbose=False)
    assert not marker.exists()
    # A raw pickle file (not torch's zip format) is refused too.
    p2 = tmp_path / "evil2.pth"
    with open(p2, "wb") as f:
        pickle.dump(_Exploit(marker), f)
    with pytest.raises(CheckpointError):
        read_checkpoint(str(p2))
    assert not marker.exists()


def test_non_dict_checkpoint(tmp_path):
    p = tmp_path / "list.pth"
    torch.save([torch.zeros(3)], p)
    with pytest.raises(CheckpointError, match="expected a dict of tensors"):
        read_checkpoint(str(p))


def test_not_an_rwkv_checkpoint(tmp_path):
    p = tmp_path / "other.pth"
    torch.save({"fc.weight": torch.zeros(3, 3)}, p)
    with pytest.raises(CheckpointError, match="no 'emb.weight'"):
        RWKV(str(p), "cpu fp32", verbose=False)


@pytest.mark.parametrize("version,key", [("4", "blocks.1.att.key.weight"), ("6", "blocks.0.att.time_maa_w"),
                                         ("7", "blocks.1.att.v0"), ("5.2", "head.weight")])
def test_missing_key_names_the_key(tmp_path, version, key):
    sd = make_checkpoint(version, **CFG)
    del sd[key]
    p = save_checkpoint(tmp_path / "m.pth", sd)
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        RWKV(str(p), "cpu fp32", verbose=False)


@pytest.mark.parametrize("version,key", [("4", "blocks.0.ffn.value.weight"), ("7", "blocks.1.att.ln_x.weight"),
                                         ("6", "blocks.1.att.receptance.weight")])
def test_wrongly_shaped_key_names_the_key(tmp_path, version, key):
    sd = make_checkpoint(version, **CFG)
    sd[key] = torch.zeros(*(s + 1 for s in sd[key].shape))
    p = save_checkpoint(tmp_path / "m.pth", sd)
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.") + ".*shape"):
        RWKV(str(p), "cpu fp32", verbose=False)


def test_safetensors_checkpoint_loads_like_pth(tmp_path, ckpt_dir):
    safetensors = pytest.importorskip("safetensors.torch")
    sd = make_checkpoint("6", **CFG)
    safetensors.save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "m.safetensors"))
    a = RWKV(str(tmp_path / "m.safetensors"), "cpu fp32", verbose=False)
    b = RWKV(str(ckpt_dir / "v6"), "cpu fp32", verbose=False)
    la, _ = a.forward([1, 2, 3], None)
    lb, _ = b.forward([1, 2, 3], None)
    assert torch.equal(la, lb)


_RSS_CHILD = """
import sys
from rwkv.model import RWKV
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096
before = rss()
m = RWKV(sys.argv[1], 'cpu fp32i8', verbose=False)
print(rss() - before, sum(t.numel() * t.element_size() for t in m.w.values()))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
def test_loading_gives_freed_memory_back(tmp_path):
    """Loading an int8 model frees many weight-sized temporaries (conversion, quantization, the
    move into huge pages). The process must keep little more than the model: without
    release_freed_memory, glibc kept them (here 1.3 GB for 175 MB of weights; 11 GB for a
    1.5B-shaped model)."""
    import subprocess
    import sys

    sd = make_checkpoint("4", n_layer=3, n_embd=2048, vocab=1000, head_size=64, seed=0, dtype=torch.bfloat16)
    path = save_checkpoint(tmp_path / "wide.pth", sd)
    del sd
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path)], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    grown, weights = map(int, out.stdout.split())
    assert grown < 2 * weights + (64 << 20), (grown, weights)
