"""Shared fixtures and parametrisation for the whole suite.

- ``rng``: a ``torch.Generator`` seeded per test (CPU; move tensors to the device afterwards).
- ``device`` (parametrised): "cpu", plus "cuda" when a GPU is present; ``RWKV_TEST_DEVICE=cpu``
  (or cuda) restricts the list. ``devices`` (fixture) and ``DEVICES`` are the same list.
- ``cpu_isa`` (parametrised): every instruction set this CPU runs and the compiled kernels offer
  (none without ``rwkv._C``); force it with ``rwkv.ops._testing.force_cpu_isa``.
- markers: ``cuda`` (skipped without a GPU), ``slow``.
- ``RWKV_TEST_EXTENSION_DIR``: a folder holding other builds of ``rwkv._C`` and ``rwkv._tokenizer``
  (``make sanitize`` points it at the AddressSanitizer build in build-asan/); the suite then loads
  them instead of the in-place ones, and stops if they do not load from there.
"""

from __future__ import annotations

import os

import pytest
import torch

_EXT_DIR = os.environ.get("RWKV_TEST_EXTENSION_DIR")


def _use_extension_dir(folder: str) -> None:
    import importlib

    import rwkv

    folder = os.path.abspath(folder)
    rwkv.__path__.insert(0, folder)  # searched first for rwkv._C and rwkv._tokenizer
    for name in ("rwkv._C", "rwkv._tokenizer"):
        module = importlib.import_module(name)
        if not os.path.abspath(module.__file__).startswith(folder + os.sep):
            raise RuntimeError(f"RWKV_TEST_EXTENSION_DIR={folder}: {name} loaded from {module.__file__}")


if _EXT_DIR:
    _use_extension_dir(_EXT_DIR)


def _devices() -> list:
    found = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    wanted = os.environ.get("RWKV_TEST_DEVICE")
    if wanted:
        found = [d for d in found if d in wanted.split(",")]
    return found


DEVICES = _devices()


def _cpu_isas() -> list:
    try:
        from rwkv.ops import _testing
    except ImportError:
        return []
    return _testing.supported_cpu_isas()


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped when none is present)")
    config.addinivalue_line("markers", "slow: long-running test")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        # The marker itself, not any node named "cuda" (item.keywords would also match the
        # tests/cuda folder or a parameter id), so CPU-runnable tests may live anywhere.
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


_ISAS = None


def pytest_generate_tests(metafunc):
    global _ISAS
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)
    if "cpu_isa" in metafunc.fixturenames:
        if _ISAS is None:
            _ISAS = _cpu_isas()
        # An empty list makes pytest skip the test with a reason naming the empty parameter set.
        metafunc.parametrize("cpu_isa", _ISAS)


@pytest.fixture
def devices() -> list:
    """The device list itself, for tests that loop over devices."""
    return list(DEVICES)


@pytest.fixture
def rng() -> torch.Generator:
    return torch.Generator().manual_seed(20240611)
