"""One short run per version and CPU strategy through the compiled kernels (a prompt, then one-token
steps, which go through the CPU step plan and its planned products), compared with the same model on the
reference kernels. ``make sanitize`` runs this file under AddressSanitizer + UBSan as the one
forward per version."""

from __future__ import annotations

import pytest
import torch

from rwkv import ops
from rwkv.model import RWKV
from tests.fixtures.make_tiny_models import VERSIONS, ensure_checkpoints, file_name

STRATEGIES = ("cpu fp32", "cpu fp32i8", "cpu bf16")
FP32_ATOL = 2e-4  # fp32 kernels sum in another order than torch's; logits are ~N(0, 2)
PROMPT = [11, 22, 33, 44, 55, 66]


def _run(model):
    logits, state = model.forward(PROMPT, None)
    out = [logits]
    for token in (7, 8, 9):
        logits, state = model.forward([token], state)
        out.append(logits)
    return torch.stack(out)


@pytest.mark.skipif(not ops.backend_report().startswith("compiled"), reason="rwkv._C is not built")
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("version", VERSIONS)
def test_compiled_forward_matches_reference(version, strategy):
    """fp32: equal to the reference within summation-order error. int8 and bf16: the compiled run's
    error against the fp32 reference is at most twice the reference run's own error in that
    strategy (the kernels round differently, not worse)."""
    path = str(ensure_checkpoints()[file_name(version)])
    got = _run(RWKV(path, strategy, verbose=False))
    assert torch.isfinite(got).all()
    exact = _run(RWKV(path, "cpu fp32", verbose=False, kernels="reference"))
    if strategy == "cpu fp32":
        torch.testing.assert_close(got, exact, rtol=0, atol=FP32_ATOL)
        return
    ref = _run(RWKV(path, strategy, verbose=False, kernels="reference"))
    ref_err = float((ref - exact).abs().max())
    assert float((got - exact).abs().max()) <= 2 * ref_err + FP32_ATOL, (ref_err, strategy)
