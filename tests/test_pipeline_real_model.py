"""PIPELINE, prefix cache and state files with real tiny checkpoints (v4, v5.2, v6, v7; World-sized
vocabulary): greedy generate token-for-token against upstream 0.8.32, cached vs uncached logits, state
file round trip and refusal."""

import numpy as np
import pytest
import torch

from _upstream_subprocess import run_upstream
from rwkv.generation import PrefixCache
from rwkv.state_io import StateFileError, load_state, save_state
from rwkv.utils import PIPELINE, PIPELINE_ARGS

make_tiny = pytest.importorskip("tests.fixtures.make_tiny_models")
VERSIONS = ["4", "5.2", "6", "7"]
PROMPTS = ["User: hi\n\nAssistant:", "\n", "The quick brown fox"]


def _write(path, version, seed=0, vocab=65536):
    sd = make_tiny.make_checkpoint(version, n_layer=2, n_embd=64, vocab=vocab, seed=seed)
    make_tiny.save_checkpoint(str(path), sd)
    return str(path)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-world")
    return {v: _write(d / f"tiny-{v}.pth", v) for v in VERSIONS}


@pytest.fixture(scope="module")
def models(ckpts):
    from rwkv.model import RWKV
    return {v: RWKV(model=p, strategy="cpu fp32", verbose=False) for v, p in ckpts.items()}


# Wraps a model and records every token list fed to forward; also defined in the upstream child.
RECORDER_SRC = r'''
class Recorder:
    def __init__(self, model):
        self.model, self.fed = model, []
    def forward(self, tokens, state, full_output=False):
        self.fed.append([int(t) for t in tokens])
        return self.model.forward(tokens, state, full_output)
'''
_ns = {}
exec(RECORDER_SRC, _ns)
Recorder = _ns["Recorder"]


_SNIPPET = r'''
os.environ['RWKV_JIT_ON'] = '1'; os.environ['RWKV_CUDA_ON'] = '0'
if PAYLOAD['v7']:
    os.environ['RWKV_V7_ON'] = '1'
import numpy as np
from rwkv.model import RWKV
from rwkv.utils import PIPELINE, PIPELINE_ARGS
RESULT = []
pipe = PIPELINE(None, 'rwkv_vocab_v20230424')  # built once: upstream's World tokenizer takes seconds
for path in PAYLOAD['models']:
    if PAYLOAD['v7']:
        m = RWKV(model=path[:-len('.pth')], strategy='cpu fp32')
    else:
        m = RWKV(model=path, strategy='cpu fp32', verbose=False)
    for prompt in PAYLOAD['prompts']:
        rec = pipe.model = Recorder(m)
        np.random.seed(0)
        text = pipe.generate(prompt, token_count=24, args=PIPELINE_ARGS(**PAYLOAD['args']))
        RESULT.append([text, rec.fed])
'''

GREEDY = dict(temperature=0, top_p=0.85, alpha_frequency=0.3, alpha_presence=0.3, token_ban=[0], chunk_len=4)


def test_greedy_generate_matches_upstream(ckpts, models):
    classic = [v for v in VERSIONS if v != "7"]
    snippet = RECORDER_SRC + _SNIPPET
    want = run_upstream(snippet, {"v7": False, "models": [ckpts[v] for v in classic], "prompts": PROMPTS,
                                  "args": GREEDY})
    want += run_upstream(snippet, {"v7": True, "models": [ckpts["7"]], "prompts": PROMPTS, "args": GREEDY})
    got = []
    pipe = PIPELINE(None, "rwkv_vocab_v20230424")
    for v in classic + ["7"]:
        for prompt in PROMPTS:
            rec = pipe.model = Recorder(models[v])
            np.random.seed(0)
            text = pipe.generate(prompt, token_count=24, args=PIPELINE_ARGS(**GREEDY))
            got.append([text, rec.fed])
    assert got == want
    for prompt, (_, fed) in zip(PROMPTS * 4, got):  # prompt in chunks of 4, then 23 single tokens
        n = len(pipe.encode(prompt))
        assert [len(f) for f in fed] == [4] * (n // 4) + ([n % 4] if n % 4 else []) + [1] * 23


@pytest.mark.parametrize("version", ["5.2", "7"])
def test_cached_logits_equal_uncached(models, version):
    model = models[version]
    pipe = PIPELINE(model, "rwkv_vocab_v20230424")
    prefix = pipe.encode("User: tell me a story\n\nAssistant: Once")
    suffix = pipe.encode(" upon a time")
    cache = PrefixCache(max_entries=4, max_bytes=1 << 26)
    out_p, st_p = model.forward(prefix, None)
    cache.put(prefix, st_p, out_p)
    _ = model.forward(suffix, st_p)  # classic forward updates st_p in place; the cache copy is intact
    hit = cache.lookup(prefix + suffix)
    assert hit.n_tokens == len(prefix) and torch.equal(hit.logits, out_p)
    cached_out, _ = model.forward(suffix, hit.state)
    ref_p_out, ref_p = model.forward(prefix, None)
    uncached_out, _ = model.forward(suffix, ref_p)
    assert torch.equal(cached_out, uncached_out)
    whole, _ = model.forward(prefix + suffix, None)
    torch.testing.assert_close(cached_out, whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("version", VERSIONS)
def test_generate_with_cache_equals_without(models, version):
    pipe = PIPELINE(Recorder(models[version]), "rwkv_vocab_v20230424")
    cache = PrefixCache()
    args = PIPELINE_ARGS(temperature=0, token_ban=[0])
    first = pipe.generate_stream("User: hi\n\nAssistant:", 12, args, cache=cache).run()
    history = pipe.encode("User: hi\n\nAssistant:") + first.tokens
    turn = history + pipe.encode("\n\nUser: more\n\nAssistant:")
    n_fed = sum(map(len, pipe.model.fed))
    cached = pipe.generate_stream(turn, 12, args, cache=cache).run()
    assert cached.cached_tokens == len(history)
    assert sum(map(len, pipe.model.fed)) - n_fed == len(turn) - len(history) + len(cached.tokens)
    plain = PIPELINE(models[version], "rwkv_vocab_v20230424").generate_stream(turn, 12, args).run()
    assert plain.tokens == cached.tokens
    torch.testing.assert_close(plain.logits, cached.logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("version", VERSIONS)
def test_state_file_round_trip(models, tmp_path, version):
    model = models[version]
    tokens = [5, 300, 7000, 11, 261]
    _, state = model.forward(tokens, None)
    path = save_state(tmp_path / "s.state", model, state, meta={"turns": 1})
    loaded, meta = load_state(path, model, with_meta=True)
    assert meta == {"turns": 1} and len(loaded) == len(state)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(loaded, state))
    out_a, _ = model.forward([42], loaded)
    out_b, _ = model.forward([42], [t.clone() for t in state])
    assert torch.equal(out_a, out_b)


def test_state_file_refuses_other_models(models, ckpts, tmp_path):
    from rwkv.model import RWKV
    _, state = models["5.2"].forward([1, 2, 3], None)
    path = save_state(tmp_path / "a.state", models["5.2"], state)
    with pytest.raises(ValueError, match="different model: version"):
        load_state(path, models["6"])
    other = RWKV(model=_write(tmp_path / "other.pth", "5.2", seed=1), strategy="cpu fp32", verbose=False)
    with pytest.raises(ValueError, match="embedding weights differ"):
        load_state(path, other)
    smaller = RWKV(model=_write(tmp_path / "small.pth", "5.2", vocab=1000), strategy="cpu fp32",
                   verbose=False)
    with pytest.raises(ValueError, match="vocab_size"):
        load_state(path, smaller)
    same_bf16 = RWKV(model=ckpts["5.2"], strategy="cpu bf16", verbose=False)
    loaded = load_state(path, same_bf16)  # the same checkpoint with another strategy is accepted
    assert [t.dtype for t in loaded] == [t.dtype for t in same_bf16.generate_zero_state()]


def test_state_file_rejects_non_state_files(models, tmp_path):
    model = models["4"]
    junk = tmp_path / "junk.state"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(StateFileError, match="not a readable state file"):
        load_state(junk, model)
    torch.save({"hello": torch.zeros(1)}, tmp_path / "dict.state")
    with pytest.raises(StateFileError, match="not an rwkv state file"):
        load_state(tmp_path / "dict.state", model)
    torch.save({"x": object.__new__(PrefixCache)}, tmp_path / "evil.state")  # needs full unpickling
    with pytest.raises(StateFileError):
        load_state(tmp_path / "evil.state", model)
    with pytest.raises(FileNotFoundError):
        load_state(tmp_path / "missing.state", model)
    with pytest.raises(TypeError):
        save_state(tmp_path / "bad.state", model, "not a state")
