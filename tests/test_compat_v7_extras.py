"""RWKV-7 beyond the common case, against the upstream rwkv 0.8.32 package itself (isolated install,
run in a subprocess by tests/upstream.py and tests/_upstream_subprocess.py):

* DeepEmbed checkpoints ("RWKV-7a", rwkv/deep_embed.py): upstream with ``RWKV_V7_ON=1
  RWKV_DE_VERSION=1``, ours with no environment variable, on seeded random checkpoints: logits and
  states in sequence and one-token mode, ``cpu fp32`` and ``cpu bf16``.
* Head sizes 32, 128 and 256 (released models use 64): upstream's CPU path is plain torch and takes
  any head size.
* ``forward_one_alt`` chained from ``generate_zero_state()`` as upstream's README decodes.

Tolerances are test_compat_upstream.py's (its module docstring says why): fp32 1e-4, bf16 16 ulps
of the tensor's magnitude or 3x upstream's own bf16-vs-fp32 difference; plus bf16 at least as close
to upstream's fp32 result as upstream's bf16 is (x2 in mean absolute error).
"""

import pytest
import torch

from rwkv.model import RWKV
from tests._upstream_subprocess import run_upstream as run_upstream_snippet
from tests.fixtures.make_tiny_models import make_checkpoint, save_checkpoint
from tests.test_compat_upstream import CALLS, _compare_runs, _err, _ours
from tests.upstream import run_upstream_many, upstream_skip_reason

pytestmark = pytest.mark.skipif(bool(upstream_skip_reason()), reason=str(upstream_skip_reason()))

STRATEGIES = ("cpu fp32", "cpu bf16")
HEAD_SIZES = (32, 128, 256)
DE_ENV = {"RWKV_DE_VERSION": "1"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("v7extras")
    out = {"de": str(save_checkpoint(d / "de.pth", make_checkpoint(
        "7", n_layer=3, n_embd=128, vocab=500, seed=11, deep_embed=True)))}
    for n in HEAD_SIZES:
        # two heads at least (256: n_embd 512), so a head mix-up shows
        out[n] = str(save_checkpoint(d / f"hs{n}.pth", make_checkpoint(
            "7", n_layer=2, n_embd=max(256, 2 * n), vocab=500, head_size=n, seed=n)))
    return out


@pytest.fixture(scope="module")
def upstream(checkpoints):
    de_runs = [(checkpoints["de"], s, CALLS) for s in STRATEGIES]
    hs_runs = [(checkpoints[n], s, CALLS) for n in HEAD_SIZES for s in STRATEGIES]
    res = run_upstream_many(de_runs, env=DE_ENV, threads=2) + run_upstream_many(hs_runs, threads=2)
    return {(m, s): r["results"] for (m, s, _), r in zip(de_runs + hs_runs, res)}


def _check_against_upstream(upstream, path, strategy, label):
    fp32 = upstream[(path, "cpu fp32")] if "bf16" in strategy else None
    ours = _ours(path, strategy)
    _compare_runs(ours, upstream[(path, strategy)], fp32, strategy, label)
    if fp32 is not None:
        mae = lambda run: sum(float((run[n]["logits"] - fp32[n]["logits"]).abs().mean())  # noqa: E731
                              for n in range(len(CALLS)))
        theirs = upstream[(path, strategy)]
        assert mae(ours) <= 2 * mae(theirs) + 1e-4, f"{label}: ours {mae(ours):.4g} vs upstream {mae(theirs):.4g}"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_deep_embed_matches_upstream(checkpoints, upstream, strategy):
    path = checkpoints["de"]
    _check_against_upstream(upstream, path, strategy, f"DeepEmbed {strategy}")


def test_deep_embed_terms_matter(checkpoints, upstream):
    # The comparison above can fail: the same checkpoint without its DeepEmbed terms (the channel
    # mix of a plain v7 model) is far from upstream's DeepEmbed result.
    sd = torch.load(checkpoints["de"], weights_only=True)
    plain = {k: v for k, v in sd.items() if ".ffn.s" not in k}
    path = checkpoints["de"].replace("de.pth", "de-stripped.pth")
    save_checkpoint(path, plain)
    ours = _ours(path, "cpu fp32")
    ref = upstream[(checkpoints["de"], "cpu fp32")]
    assert max(_err(o["logits"], r["logits"]) for o, r in zip(ours, ref)) > 1.0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_head_size_matches_upstream(checkpoints, upstream, head_size, strategy):
    path = checkpoints[head_size]
    m = RWKV(path, strategy, verbose=False)
    assert (m.head_size, m.n_head) == (head_size, m.n_embd // head_size)
    _check_against_upstream(upstream, path, strategy, f"head size {head_size} {strategy}")


ALT_TOKENS = [17, 3, 250, 499, 0, 42, 7, 7, 120, 5, 9, 10, 11, 33, 1, 2]  # 16 tokens

_ALT_SNIPPET = r"""
os.environ["RWKV_V7_ON"] = "1"
os.environ["RWKV_CUDA_ON"] = "0"
import torch
torch.set_num_threads(2)
from rwkv.model import RWKV
model = RWKV(model=PAYLOAD["model"], strategy="cpu fp32")
state = model.generate_zero_state()
logits = []
for token in PAYLOAD["tokens"]:
    out, state = model.forward_one_alt(model.z["emb.weight"][token], state)
    logits.append(out.tolist())
RESULT = {"logits": logits, "n_embd": model.n_embd, "vocab_size": model.args.vocab_size,
          "n_layer": model.n_layer, "n_head": model.n_head, "head_size": model.head_size}
"""


def test_forward_one_alt_chain_matches_upstream(checkpoints):
    # Upstream's README decoding loop, without its CUDA graph: forward_one_alt from
    # generate_zero_state(), the embedding row taken from model.z, for 16 tokens.
    path = checkpoints[128]
    ref = run_upstream_snippet(_ALT_SNIPPET, {"model": path[:-len(".pth")], "tokens": ALT_TOKENS})
    m = RWKV(path, "cpu fp32", verbose=False)
    assert [ref[k] for k in ("n_embd", "vocab_size", "n_layer", "n_head", "head_size")] == \
        [m.n_embd, m.args.vocab_size, m.n_layer, m.n_head, m.head_size]
    state = m.generate_zero_state()
    for n, token in enumerate(ALT_TOKENS):
        out, state = m.forward_one_alt(m.z["emb.weight"][token], state)
        torch.testing.assert_close(out, torch.tensor(ref["logits"][n]), rtol=1e-4, atol=1e-4,
                                   msg=lambda s: f"token {n}: {s}")


_Z_SNIPPET = r"""
os.environ["RWKV_V7_ON"] = "1"
os.environ["RWKV_CUDA_ON"] = "0"
import torch
from rwkv.model import RWKV
model = RWKV(model=PAYLOAD["model"], strategy="cpu fp32")
torch.save({k: v.clone() for k, v in model.z.items()}, PAYLOAD["out"])
RESULT = sorted(model.z)
"""


@pytest.mark.parametrize("slab_bytes", [None, 256])
def test_z_matches_upstream(checkpoints, tmp_path, monkeypatch, slab_bytes):
    # model.z: upstream's names, shapes and values (256 slab bytes: every fp32 matrix of more than
    # 64 rows kept as row slabs, given back as one matrix).
    from rwkv import slabs

    path = checkpoints[32]
    out = str(tmp_path / "z.pth")
    keys = run_upstream_snippet(_Z_SNIPPET, {"model": path[:-len(".pth")], "out": out})
    theirs = torch.load(out, weights_only=True)
    if slab_bytes is not None:
        monkeypatch.setattr(slabs, "SLAB_BYTES", slab_bytes)
    m = RWKV(path, "cpu fp32", verbose=False)
    if slab_bytes is not None:
        assert m.w["blocks.0.ffn.value.weight"].dim() == 3
    unused = {"blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2", "blocks.0.ln0.weight", "blocks.0.ln0.bias"}
    assert set(m.z) == set(keys) - unused
    for k in m.z:
        assert m.z[k].shape == theirs[k].shape, k
        torch.testing.assert_close(m.z[k], theirs[k], rtol=1e-6, atol=1e-6, msg=lambda s: f"{k}: {s}")
