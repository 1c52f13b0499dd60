"""text-generation-webui's old RWKV loader (modules/RWKV.py, last version before its removal in
Dec 2023) must work unchanged against this package. Its code is not copied here; ``WEBUI_SESSION``
performs the same calls in the same order: RWKV_JIT_ON / RWKV_CUDA_ON set before importing
rwkv.model, ``RWKV(model=str(path), strategy=...)``, ``PIPELINE(model, str(dir / '20B_tokenizer.json'))``,
``PIPELINE_ARGS`` with its keywords, ``encode`` (including ``encode('')`` when the prompt equals the
cached context), chunked ``forward`` over ``args.chunk_len``, ``copy.deepcopy`` of state and logits,
``out[n] = -inf`` and ``out[n] -= penalty`` in place, ``sample_logits(out, temperature=, top_p=,
top_k=)``, ``decode`` with U+FFFD gating. The same session runs in a fresh process against our package
and against upstream 0.8.32; results must agree. World-vocabulary usage goes through the same calls.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from _upstream_subprocess import run_upstream

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER_20B = "/work/shared/data/20B_tokenizer.json"

WEBUI_SESSION = r'''
import copy, os
os.environ['RWKV_JIT_ON'] = '1'
os.environ['RWKV_CUDA_ON'] = PAYLOAD.get('cuda_on', '0')
import numpy as np
from rwkv.model import RWKV
from rwkv.utils import PIPELINE, PIPELINE_ARGS

def session(model_path, word_name, sampling, messages, max_new_tokens, seed):
    model = RWKV(model=str(model_path), strategy='cpu fp32')
    pipeline = PIPELINE(model, word_name)
    cached = {'context': '', 'state': None, 'logits': None}
    prompt, turns = '', []
    np.random.seed(seed)
    for msg in messages:
        if msg == '<regenerate>':  # webui drops the last reply and sends the same prompt again
            prompt = asked
        else:
            prompt += 'Bob: ' + msg + '\n\nAlice:'
        asked = prompt
        args = PIPELINE_ARGS(temperature=sampling['temperature'], top_p=sampling['top_p'],
                             top_k=sampling['top_k'], alpha_frequency=0.1, alpha_presence=0.1,
                             token_ban=[0], token_stop=[])
        ctx = prompt
        if cached['context'] != '':
            if ctx.startswith(cached['context']):
                ctx = ctx[len(cached['context']):]
            else:
                cached = {'context': '', 'state': None, 'logits': None}
        state = copy.deepcopy(cached['state']) if cached['state'] is not None else None
        out = cached['logits'] if ctx == '' else None
        all_tokens, out_str, pieces, occurrence, token, fed = [], '', [], {}, None, 0
        for i in range(max_new_tokens):
            tokens = pipeline.encode(ctx) if i == 0 else [token]
            while len(tokens) > 0:
                out, state = model.forward(tokens[:args.chunk_len], state)
                fed += len(tokens[:args.chunk_len])
                tokens = tokens[args.chunk_len:]
            if i == 0:
                begin = last = len(all_tokens)
                cached['context'] += ctx
                cached['state'] = copy.deepcopy(state)
                cached['logits'] = copy.deepcopy(out)
            for n in args.token_ban:
                out[n] = -float('inf')
            for n in occurrence:
                out[n] -= (args.alpha_presence + occurrence[n] * args.alpha_frequency)
            token = pipeline.sample_logits(out, temperature=args.temperature, top_p=args.top_p,
                                           top_k=args.top_k)
            if token in args.token_stop:
                break
            all_tokens += [token]
            occurrence[token] = occurrence.get(token, 0) + 1
            tmp = pipeline.decode(all_tokens[last:])
            if '\ufffd' not in tmp:
                pieces.append(tmp)
                out_str += tmp
                last = begin + i + 1
        turns.append([out_str, pieces, all_tokens, fed, pipeline.encode('')])
        prompt += out_str + '\n\n'
    return turns

RESULT = [session(r['model'], r['word_name'], r['sampling'], PAYLOAD['messages'], PAYLOAD['max_new_tokens'],
                  PAYLOAD['seed']) for r in PAYLOAD['runs']]
'''

MESSAGES = ["Hello, who are you?", "Tell me more.", "<regenerate>", "Thanks!"]
GREEDY = {"temperature": 1.0, "top_p": 0.0, "top_k": 50}
SAMPLED = {"temperature": 0.8, "top_p": 0.5, "top_k": 0}


def run_ours(snippet, payload):
    """Run ``snippet`` in a fresh process importing this repository's ``rwkv``."""
    code = "import json, sys\nPAYLOAD = json.loads(sys.stdin.read())\n" + snippet + \
        "\nsys.stdout.write('\\n@@RESULT@@' + json.dumps(RESULT))\n"
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), capture_output=True,
                          text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.rsplit("\n@@RESULT@@", 1)[1])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    make_tiny = pytest.importorskip("tests.fixtures.make_tiny_models")
    if not os.path.exists(TOKENIZER_20B):
        pytest.skip("shared 20B_tokenizer.json missing")
    d = tmp_path_factory.mktemp("webui")
    shutil.copy(TOKENIZER_20B, d / "20B_tokenizer.json")  # webui keeps it next to the model
    paths = {}
    for version, vocab in (("4", 50277), ("5.2", 50277), ("7", 50277), ("5.2", 65536)):
        name = f"tiny-{version}-{vocab}.pth"
        sd = make_tiny.make_checkpoint(version, n_layer=2, n_embd=64, vocab=vocab, seed=0)
        make_tiny.save_checkpoint(str(d / name), sd)
        paths[(version, vocab)] = str(d / name)
    return d, paths


def _runs(d, paths, keys, sampling):
    runs = []
    for version, vocab in keys:
        word = str(d / "20B_tokenizer.json") if vocab == 50277 else "rwkv_vocab_v20230424"
        runs.append({"model": paths[(version, vocab)], "word_name": word, "sampling": sampling})
    return runs


def test_webui_session_matches_upstream(models):
    d, paths = models
    keys = [("4", 50277), ("5.2", 50277), ("5.2", 65536)]  # 20B (as webui) and World vocabularies
    payload = {"messages": MESSAGES, "max_new_tokens": 16, "seed": 0,
               "runs": _runs(d, paths, keys, GREEDY)}
    ours = run_ours(WEBUI_SESSION, payload)
    theirs = run_upstream(WEBUI_SESSION, payload)
    assert ours == theirs
    for turns in ours:
        assert [t[4] for t in turns] == [[]] * len(MESSAGES)  # encode('') == []
        regenerate = turns[2]
        assert regenerate[3] == 15  # prompt fully cached: only the generated tokens were fed
        assert regenerate[2] == turns[1][2]  # greedy from the cached logits: the same reply


def test_webui_session_ours_sampled_with_cuda_flag_and_v7(models):
    d, paths = models
    keys = [("5.2", 50277), ("7", 50277)]  # v7 loads without RWKV_V7_ON in our package
    payload = {"messages": MESSAGES, "max_new_tokens": 12, "seed": 3, "cuda_on": "1",
               "runs": _runs(d, paths, keys, SAMPLED)}
    first = run_ours(WEBUI_SESSION, payload)
    assert first == run_ours(WEBUI_SESSION, payload)  # same seed, same session: same everything
    for turns in first:
        assert all(t[3] > 0 for t in turns) and any(t[0] for t in turns)
        assert turns[2][3] == 11  # the regenerate turn reused the cached (deep-copied) logits
