"""Files are never lost or read after they change: conversion writes a new file and renames it into
place (so converting a checkpoint onto its own path works, and an interrupted conversion leaves the
original as it was), and a loaded model, a loaded state-tuning file and a loaded state file keep no
mapping of their files (saving another file over them changes nothing and never faults).

Cases that would kill the process (SIGBUS on a truncated mapping) run in a child process."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from rwkv import files
from rwkv.model import RWKV, convert_checkpoint
from tests._child import describe, run_child
from tests.fixtures.make_tiny_models import VERSIONS, ensure_checkpoints, file_name, make_checkpoint, save_checkpoint

STRATEGIES = ("cpu fp32", "cpu fp32i8", "cpu bf16")
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def fixtures():
    return ensure_checkpoints()


def _logits(path, strategy):
    out, _ = RWKV(str(path), strategy, verbose=False).forward(TOKENS, None)
    return out


CONVERT_IN_PLACE = r"""
import sys
from rwkv.model import RWKV, convert_checkpoint
for job in sys.argv[1:]:
    how, path, strategy = job.split("|")
    if how == "function":
        convert_checkpoint(path, strategy, path)
    else:
        try:
            RWKV(path, strategy, verbose=False, convert_and_save_and_exit=path)
        except SystemExit as e:  # upstream's behaviour: exit(0) once saved
            assert e.code == 0, e.code
"""


def test_converting_onto_the_source_path_keeps_a_loadable_file(tmp_path, fixtures):
    """Every version and int8/bf16/fp32 strategy, through both entry points, in one child process."""
    jobs = []
    for version in VERSIONS:
        for strategy in STRATEGIES:
            for how in ("function", "convert_and_save_and_exit"):
                dst = tmp_path / f"v{version}-{strategy.replace(' ', '-')}-{how}.pth"
                shutil.copy(fixtures[file_name(version)], dst)
                jobs.append((version, strategy, how, dst))
    proc = run_child(CONVERT_IN_PLACE, *(f"{how}|{dst}|{strategy}" for _, strategy, how, dst in jobs))
    assert proc.returncode == 0, describe(proc)
    assert sorted(os.listdir(tmp_path)) == sorted(dst.name for *_, dst in jobs)  # no temporary file left
    for version, strategy, _, dst in jobs:
        torch.testing.assert_close(_logits(dst, strategy), _logits(fixtures[file_name(version)], strategy),
                                   rtol=0, atol=0, msg=f"{dst.name}")


def test_an_interrupted_conversion_leaves_the_original_and_no_temporary_file(tmp_path, fixtures, monkeypatch):
    dst = tmp_path / "m.pth"
    shutil.copy(fixtures[file_name("7")], dst)
    before = dst.read_bytes()

    def half_written_then_interrupted(obj, f):
        f.write(b"PK\x03\x04 partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(files.torch, "save", half_written_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(dst, "cpu fp32", dst)
    assert dst.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.pth"]


def test_atomic_save_gives_the_permissions_of_a_plain_write(tmp_path):
    old = os.umask(0o027)
    try:
        path = files.save_atomic({"x": torch.zeros(2)}, tmp_path / "a.pth")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.zeros(2))


REWRITE_CHECKPOINT = r"""
import json, os, sys, torch
from rwkv.model import RWKV
path, strategy, other_small, other_large = sys.argv[1:]
model = RWKV(path, strategy, verbose=False)
before, _ = model.forward(%(tokens)s, None)
mapped = os.path.realpath(path) in open("/proc/self/maps").read()
results = []
for other in (other_small, other_large):
    with open(path, "wb") as f:  # in place: the same inode, truncated and rewritten
        f.write(open(other, "rb").read())
    after, _ = model.forward(%(tokens)s, None)
    results.append(bool(torch.equal(before, after)))
print(json.dumps({"mapped": mapped, "same": results}))
""" % {"tokens": TOKENS}


@pytest.mark.parametrize("hugepages", ["0", "1"])
@pytest.mark.parametrize("strategy", ["cpu fp32", "cpu bf16"])
def test_rewriting_a_loaded_checkpoint_changes_nothing(tmp_path, hugepages, strategy):
    path = save_checkpoint(tmp_path / "m.pth", make_checkpoint("7", n_embd=64, seed=1))
    small = save_checkpoint(tmp_path / "small.pth", {"x": torch.zeros(4)})
    large = save_checkpoint(tmp_path / "large.pth", make_checkpoint("7", n_embd=128, seed=2))
    proc = run_child(REWRITE_CHECKPOINT, path, strategy, small, large, env={"RWKV_CPU_HUGEPAGES": hugepages})
    assert proc.returncode == 0, describe(proc)
    assert json.loads(proc.stdout.splitlines()[-1]) == {"mapped": False, "same": [True, True]}


REWRITE_STATE_FILES = r"""
import json, os, sys, torch
from rwkv.model import RWKV
from rwkv.state_io import save_state, load_state
model_path, tuning_path, state_path, junk = sys.argv[1:]
model = RWKV(model_path, "cpu fp32", verbose=False)
model.load_state_tuning(tuning_path)
_, state = model.forward([1, 2, 3], None)
save_state(state_path, model, state)
loaded = load_state(state_path, model)
before, _ = model.forward([7], None)
before_state, _ = model.forward([7], loaded)
maps = open("/proc/self/maps").read()
mapped = [os.path.realpath(p) in maps for p in (tuning_path, state_path)]
for p in (tuning_path, state_path):
    with open(p, "wb") as f:  # in place, smaller: a mapping of it would fault on the next read
        f.write(open(junk, "rb").read())
after, _ = model.forward([7], None)
after_state, _ = model.forward([7], loaded)
print(json.dumps({"mapped": mapped, "same": [bool(torch.equal(before, after)),
                                             bool(torch.equal(before_state, after_state))]}))
"""


def test_rewriting_loaded_state_tuning_and_state_files_changes_nothing(tmp_path):
    model = save_checkpoint(tmp_path / "m.pth", make_checkpoint("7", n_embd=64, seed=1))
    H, N = 2, 32
    tuning = save_checkpoint(tmp_path / "tuning.pth",
                             {f"blocks.{i}.att.time_state": torch.randn(H, N, N) for i in range(2)})
    junk = save_checkpoint(tmp_path / "junk.pth", {"x": torch.zeros(1)})
    proc = run_child(REWRITE_STATE_FILES, model, tuning, tmp_path / "s.state", junk)
    assert proc.returncode == 0, describe(proc)
    assert json.loads(proc.stdout.splitlines()[-1]) == {"mapped": [False, False], "same": [True, True]}
