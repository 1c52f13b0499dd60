"""Bad input raises our typed error at the point it is given, with a message naming what was wrong
and what was expected: CheckpointError for files (keys, shapes, converted int8 side tensors,
non-finite weights, files that are not regular or whose size does not match their header),
StateError, TokenError, StrategyError, ValueError for sampling arguments; tokenizers raise
ValueError-family errors on both paths. Valid input in other layouts (non-contiguous states) is
accepted."""

from __future__ import annotations

import array
import json
import os
import re

import numpy as np
import pytest
import torch

from rwkv.loading import CheckpointError, inspect_checkpoint
from rwkv.model import RWKV, StateError, StrategyError, TokenError, convert_checkpoint
from rwkv.utils import PIPELINE, PIPELINE_ARGS
from tests.fixtures.make_tiny_models import VERSIONS, make_checkpoint, save_checkpoint

TINY = dict(n_layer=2, n_embd=64, vocab=300, seed=5)


def _load(tmp_path, sd, name="m.pth", strategy="cpu fp32"):
    path = tmp_path / name
    torch.save(sd, path)  # converted files carry metadata strings besides tensors
    return RWKV(str(path), strategy, verbose=False)


# ------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("version,key", [
    ("4", "blocks.1.att.time_first"), ("5.2", "blocks.1.att.gate.weight"), ("6", "blocks.0.att.time_maa_w2"),
    ("7", "blocks.1.att.v2"), ("7", "blocks.1.ffn.x_k"), ("7", "ln_out.bias"),
])
def test_a_missing_key_is_named(tmp_path, version, key):
    sd = make_checkpoint(version, **TINY)
    del sd[key]
    with pytest.raises(CheckpointError, match=f"missing the key '{key}'"):
        _load(tmp_path, sd)


@pytest.mark.parametrize("version,key,shape", [
    ("7", "blocks.1.att.w1", (64, 17)),        # LoRA factor disagreeing with its partner w2
    ("7", "blocks.0.att.a2", (12, 63)),
    ("7", "blocks.1.ln1.weight", (65,)),
    ("7", "blocks.1.att.x_k", (1, 1, 63)),
    ("6", "blocks.1.att.time_decay_w1", (64, 30)),
    ("6", "blocks.0.att.time_maa_k", (1, 1, 32)),
    ("5.2", "blocks.1.att.time_decay", (2, 31)),
    ("5.1", "blocks.1.att.time_first", (3,)),
    ("4", "blocks.1.ln2.bias", (32,)),
    ("4", "blocks.1.ffn.value.weight", (64, 255)),
])
def test_a_mis_shaped_tensor_is_named_with_the_expected_shape(tmp_path, version, key, shape):
    sd = make_checkpoint(version, **TINY)
    assert tuple(sd[key].shape) != shape
    sd[key] = torch.zeros(shape)
    with pytest.raises(CheckpointError, match=re.escape(f"{key} has shape {list(shape)}, expected [")):
        _load(tmp_path, sd)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_extra_key_is_named(tmp_path, version):
    sd = make_checkpoint(version, **TINY)
    sd["blocks.1.att.surprise"] = torch.zeros(3)
    with pytest.raises(CheckpointError, match=r"does not have: 'blocks.1.att.surprise'"):
        _load(tmp_path, sd)


def test_blocks_must_be_numbered_without_gaps(tmp_path):
    sd = make_checkpoint("7", **TINY)
    sd = {k.replace("blocks.1.", "blocks.999999999."): v for k, v in sd.items()}
    with pytest.raises(CheckpointError, match="keys of block 999999999 but none of block 1"):
        _load(tmp_path, sd)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_weight_is_named(tmp_path, value):
    sd = make_checkpoint("6", **TINY)
    sd["blocks.1.att.key.weight"][3, 4] = value
    with pytest.raises(CheckpointError, match=rf"blocks.1.att.key.weight holds a non-finite value \({value}"):
        _load(tmp_path, sd)


def _converted(tmp_path, version, strategy):
    src = save_checkpoint(tmp_path / "src.pth", make_checkpoint(version, **TINY))
    out = convert_checkpoint(src, strategy, tmp_path / "conv.pth")
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("version", ["5.2", "7"])
def test_a_converted_file_with_a_one_dimensional_matrix_is_named(tmp_path, version):
    sd = _converted(tmp_path, version, "cpu fp32")
    sd["blocks.0.att.key.weight"] = sd["blocks.0.att.key.weight"].reshape(-1)
    with pytest.raises(CheckpointError, match=r"blocks.0.att.key.weight has shape \[4096\], expected a 2-D"):
        _load(tmp_path, sd, "bad.pth")
    sd = _converted(tmp_path, version, "cpu fp32")
    sd["blocks.1.ffn.value.weight"] = sd["blocks.1.ffn.value.weight"].reshape(-1)
    with pytest.raises(CheckpointError, match=r"blocks.1.ffn.value.weight has shape \[\d+\], expected \[\d+, 64\]"):
        _load(tmp_path, sd, "bad.pth")


@pytest.mark.parametrize("suffix,shape", [("_mx", (5,)), ("_ry", (64,)), ("_my", (64, 2))])
def test_converted_int8_side_tensors_are_checked(tmp_path, suffix, shape):
    sd = _converted(tmp_path, "5.2", "cpu fp32i8")
    key = "blocks.1.att.receptance.weight" + suffix
    sd[key] = torch.ones(shape)
    with pytest.raises(CheckpointError, match=re.escape(f"{key} has shape {list(shape)}")):
        _load(tmp_path, sd, "bad.pth", "cpu fp32i8")
    del sd[key]
    with pytest.raises(CheckpointError, match=rf"has no '{key}'"):
        _load(tmp_path, sd, "bad.pth", "cpu fp32i8")


def test_a_link_to_a_device_is_not_read(tmp_path):
    link = tmp_path / "zero.pth"
    os.symlink("/dev/zero", link)
    with pytest.raises(CheckpointError, match="is not a regular file"):
        RWKV(str(link), "cpu fp32", verbose=False)


def _safetensors(tmp_path, sd):
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file(sd, str(path))
    return path


@pytest.mark.parametrize("change,match", [
    (lambda b: b[:-10], "describes .* bytes of tensor data, but the file holds"),
    (lambda b: b + b"\0" * 16, "describes .* bytes of tensor data, but the file holds"),
    (lambda b: (2**40).to_bytes(8, "little") + b[8:], "header claims 1099511627776 bytes"),
    (lambda b: b[:8] + b"[" + b[9:], "not valid JSON"),
])
def test_a_safetensors_file_whose_size_does_not_match_its_header(tmp_path, change, match):
    pytest.importorskip("safetensors")
    path = _safetensors(tmp_path, make_checkpoint("7", **TINY))
    path.write_bytes(change(path.read_bytes()))
    with pytest.raises(CheckpointError, match=match):
        RWKV(str(path), "cpu fp32", verbose=False)


def test_inspect_reports_every_key_problem_as_a_checkpoint_error():
    sd = make_checkpoint("7", **TINY)
    sd["blocks.0.att.r_k"] = torch.zeros(7)
    with pytest.raises(CheckpointError, match="r_k has shape"):
        inspect_checkpoint(sd)


# ------------------------------------------------------------------------------ states and tokens
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {v: RWKV(str(save_checkpoint(d / f"{v}.pth", make_checkpoint(v, **TINY))), "cpu fp32", verbose=False)
            for v in ("4", "5.2", "6", "7")}


def _other_layout(t):
    """The same values in non-contiguous memory."""
    if t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t.repeat_interleave(2)[::2]


@pytest.mark.parametrize("version", ["4", "5.2", "6", "7"])
def test_a_non_contiguous_state_is_accepted_and_left_alone(models, version):
    model = models[version]
    _, state = model.forward([1, 2, 3], None)
    want, _ = model.forward([4, 5], list(state))
    other = [_other_layout(t) for t in state]
    assert not any(t.is_contiguous() for t in other if t.numel() > 1)
    given, before = list(other), [t.clone() for t in other]
    got, _ = model.forward([4, 5], other)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(given, before))  # the caller's tensors: unwritten


def test_a_state_on_the_meta_device_is_a_state_error(models):
    _, state = models["7"].forward([1], None)
    with pytest.raises(StateError, match=r"state\[0\] .* is on meta, expected cpu"):
        models["7"].forward([1], [t.to("meta") for t in state])


@pytest.mark.parametrize("tokens", [{1: 2}, {1, 2}, b"\x01\x02", (i for i in [1, 2]), "ab", range(3)])
def test_only_sequences_of_ids_are_token_inputs(models, tokens):
    with pytest.raises(TokenError, match="tokens must be a list of token ids"):
        models["7"].forward(tokens, None)


@pytest.mark.parametrize("tokens", [np.array([5, 2**64 - 1], np.uint64), [np.uint64(2**64 - 1)],
                                    torch.tensor([2**64 - 1], dtype=torch.uint64)])
def test_an_unsigned_id_is_reported_as_its_value(models, tokens):
    with pytest.raises(TokenError, match="token id 18446744073709551615 is out of range"):
        models["7"].forward(tokens, None)


def test_unsigned_arrays_of_valid_ids_run(models):
    want, _ = models["7"].forward([5, 6], None)
    got, _ = models["7"].forward(np.array([5, 6], np.uint64), None)
    assert torch.equal(got, want)


def test_a_layer_count_with_thousands_of_digits_is_a_strategy_error(models):
    with pytest.raises(StrategyError, match="followed by 5000 digits is too large"):
        RWKV("unused", "cpu fp32 *" + "9" * 5000 + " -> cpu bf16", verbose=False)


# -------------------------------------------------------------------------- generation, tokenizers
@pytest.mark.parametrize("args,match", [
    (PIPELINE_ARGS(token_ban=[300]), r"token_ban\[0\] = 300 is outside the vocabulary"),
    (PIPELINE_ARGS(token_ban=[0, "x"]), r"token_ban\[1\] must be an int"),
    (PIPELINE_ARGS(top_p=1.5), "top_p must be between 0 and 1"),
    (PIPELINE_ARGS(top_k=-2), "top_k must be a whole number"),
    (PIPELINE_ARGS(temperature=float("inf")), "temperature must be a finite number"),
])
def test_bad_generation_arguments_fail_before_the_state_is_touched(models, args, match):
    model = models["5.2"]  # a classic version: its forward updates the caller's list in place
    _, state = model.forward([1, 2], None)
    given, before = list(state), [t.clone() for t in state]
    pipe = PIPELINE(model, "rwkv_vocab_v20230424")
    with pytest.raises(ValueError, match=match):
        pipe.generate("hi", token_count=2, args=args, state=state)
    assert all(a is b for a, b in zip(state, given))
    assert all(torch.equal(a, b) for a, b in zip(state, before))


@pytest.fixture(scope="module")
def hf_pipeline():
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "rwkv7-tiny", "tokenizer.json")
    return PIPELINE(None, path)


@pytest.mark.parametrize("ids", [[-1], [10**6], [2**70], ["a"], [1.5], [True]])
def test_hf_decode_of_a_bad_id_is_a_value_error(hf_pipeline, ids):
    with pytest.raises(ValueError, match=r"token id .* at position 0 is outside the vocabulary"):
        hf_pipeline.decode(ids)


def test_a_lone_surrogate_is_the_same_error_on_both_tokenizers(hf_pipeline):
    world = PIPELINE(None, "rwkv_vocab_v20230424")
    for pipe in (hf_pipeline, world):
        with pytest.raises(UnicodeEncodeError, match="surrogates not allowed"):
            pipe.encode("a\ud800b")
        with pytest.raises(TypeError, match="expected a str"):
            pipe.encode(b"ab")


@pytest.mark.parametrize("view", [memoryview(array.array("i", [104, 105, 300])),
                                  memoryview(np.array([[1, 2], [3, 4]], np.uint8)),
                                  memoryview(b"hello")])
def test_world_tokenizers_agree_on_memoryviews(view):
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER, WORLD_VOCAB_FILE

    native = TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=None)
    python = TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=False)
    assert native.encodeBytes(view) == python.encodeBytes(view) == python.encodeBytes(view.tobytes())
    if view.ndim == 1:
        assert native.decodeBytes(view) == python.decodeBytes(view) == python.decodeBytes(view.tolist())


def test_json_header_helper_is_strict_about_offsets(tmp_path):
    pytest.importorskip("safetensors")
    path = _safetensors(tmp_path, {"x": torch.zeros(2)})
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["x"]["data_offsets"] = "nope"
    body = json.dumps(header).encode()
    path.write_bytes(len(body).to_bytes(8, "little") + body + data[8 + n:])
    with pytest.raises(CheckpointError, match="not valid JSON with data_offsets"):
        RWKV(str(path), "cpu fp32", verbose=False)


@pytest.mark.parametrize("version", ["5.2", "7"])
def test_the_batched_and_upstream_v7_entry_points_accept_non_contiguous_states(models, version):
    from rwkv.engine import forward_batch

    model = models[version]
    _, state = model.forward([1, 2, 3], None)
    other = [_other_layout(t) for t in state]
    want, _ = forward_batch(model, [[4], [5]], [list(state), None])
    got, _ = forward_batch(model, [[4], [5]], [other, None])
    assert torch.equal(got, want)
    x = model.z["emb.weight"][4]
    want, _ = model.forward_one_alt(x, list(state))
    got, _ = model.forward_one_alt(x, other)
    assert torch.equal(got, want)


@pytest.mark.parametrize("version,key,shape", [("6", "blocks.1.att.time_maa_w2", (160,)),
                                               ("7", "blocks.0.att.g2", (0,))])
def test_a_low_rank_factor_without_its_width_is_named(tmp_path, version, key, shape):
    sd = make_checkpoint(version, **TINY)
    sd[key] = torch.zeros(shape)
    with pytest.raises(CheckpointError, match=re.escape(f"{key} has shape {list(shape)}, expected [")):
        _load(tmp_path, sd)
