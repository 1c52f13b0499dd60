"""Shared fixtures and parametrisation for the whole suite.

- ``rng``: a ``torch.Generator`` seeded per test (CPU; move tensors to the device afterwards).
- ``device`` (parametrised): "cpu", plus "cuda" when a GPU is present; ``RWKV_TEST_DEVICE=cpu``
  (or cuda) restricts the list. ``devices`` (fixture) and ``DEVICES`` are the same list.
- ``cpu_isa`` (parametrised): every instruction set this CPU runs and the compiled kernels offer
  (none without ``rwkv._C``); force it with ``rwkv.ops._testing.force_cpu_isa``.
- markers: ``cuda`` (skipped without a GPU), ``slow``.
"""

from __future__ import annotations

import os

import pytest
import torch


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
