"""A deterministic stand-in for ``RWKV`` (tests of the pipeline, generation, cache and programs).

``FAKE_MODEL_SRC`` is also executed inside the upstream subprocess, so both packages drive the very
same model. Logits depend on every token fed so far (a rolling hash seeds ``torch.randn``); ``fed``
counts the tokens that went through ``forward``; ``boost`` ids get +8 so they are sampled often.
"""

# Executed here and in the upstream subprocess: a tiny deterministic stand-in for RWKV.forward with the
# classic class's state semantics (the caller's list is updated in place and returned).
FAKE_MODEL_SRC = r'''
import torch
class FakeModel:
    def __init__(self, vocab, scale=3.0, boost=()):
        self.vocab, self.scale, self.fed, self.boost = vocab, scale, 0, list(boost)
    def forward(self, tokens, state, full_output=False):
        if state is None:
            state = [torch.zeros(1, dtype=torch.float64)]
        h = int(state[0][0])
        for t in tokens:
            h = (h * 1000003 + int(t) + 1) % 2147483647
        self.fed += len(tokens)
        state[0][0] = h
        g = torch.Generator().manual_seed(h)
        out = torch.randn(self.vocab, generator=g) * self.scale
        out[self.boost] += 8.0  # make these (whitespace/digit) tokens frequent
        return out, state
'''
_ns = {}
exec(FAKE_MODEL_SRC, _ns)
FakeModel = _ns["FakeModel"]
