"""World tokenizer speed: ours (C++ fast path, and our pure-Python reference) vs upstream 0.8.32's
pure-Python tokenizer, on the same ~1 MB of mixed text, in the same run.

    .venv/bin/python benchmarks/bench_tokenizer.py [--mb 1.0] [--repeat 3]

Upstream runs in a subprocess (same package name ``rwkv``) with ``.upstream`` first on sys.path.
Reports the best of ``--repeat`` timings for encode and decode, and the ratios.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
UPSTREAM = os.path.join(REPO, ".upstream")
LAMBADA = "/work/shared/data/lambada_test.jsonl"

_CHILD = r'''
import json, os, sys, time
sys.path[:] = [p for p in sys.path if p not in ('', '.') and os.path.abspath(p) != REPO]
sys.path.insert(0, UPSTREAM)
import rwkv
assert os.path.abspath(rwkv.__file__).startswith(UPSTREAM), rwkv.__file__
from rwkv.rwkv_tokenizer import TRIE_TOKENIZER
tok = TRIE_TOKENIZER(os.path.join(UPSTREAM, "rwkv", "rwkv_vocab_v20230424.txt"))
text = open(TEXT, encoding="utf-8").read()
enc, dec = [], []
for _ in range(REPEAT):
    t = time.perf_counter(); ids = tok.encode(text); enc.append(time.perf_counter() - t)
    t = time.perf_counter(); out = tok.decode(ids); dec.append(time.perf_counter() - t)
assert out == text
print(json.dumps({"encode": min(enc), "decode": min(dec), "n_tokens": len(ids), "ids_head": ids[:50]}))
'''


def mixed_text(n_bytes, seed=0):
    """English prose (LAMBADA when available) interleaved with CJK, Cyrillic, emoji, code and digits."""
    rng = random.Random(seed)
    if os.path.exists(LAMBADA):
        with open(LAMBADA, encoding="utf-8") as f:
            prose = [json.loads(line)["text"] for line in f]
    else:
        prose = ["The quick brown fox jumps over the lazy dog, again and again."] * 100
    extras = ["你好，世界！这是一个混合文本的测试。", "日本語のテキストも少し入れます。", "Привет, как дела?",
              "😀👍🏽🚀 emoji ❤️", "def f(x):\n    return x * 2\n", "3.14159 2.71828 1234567890",
              "\n\n", "\t| a | b |\n", "Ünïcödé àccénts — “quotes”"]
    parts, size = [], 0
    while size < n_bytes:
        piece = rng.choice(prose) if rng.random() < 0.6 else rng.choice(extras)
        parts.append(piece)
        size += len(piece.encode("utf-8"))
    data = "\n".join(parts).encode("utf-8")[:n_bytes]
    return data.decode("utf-8", errors="ignore")


def best_of(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0, help="text size in MB (default 1.0)")
    ap.add_argument("--repeat", type=int, default=3, help="timings per figure; the best is kept")
    ap.add_argument("--no-python", action="store_true", help="skip our pure-Python reference")
    args = ap.parse_args()

    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER, WORLD_VOCAB_FILE
    text = mixed_text(int(args.mb * 1_000_000))
    n_bytes = len(text.encode("utf-8"))
    ours = TRIE_TOKENIZER(WORLD_VOCAB_FILE)
    if not ours.native:
        sys.exit("rwkv._tokenizer is not built: "
                 "flock /tmp/rwkv-build.lock python setup.py build_ext --inplace")
    enc_t, ids = best_of(lambda: ours.encode(text), args.repeat)
    dec_t, back = best_of(lambda: ours.decode(ids), args.repeat)
    assert back == text, "round trip failed"
    rows = [("ours (C++)", enc_t, dec_t)]
    if not args.no_python:
        ref = TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=False)
        _ = ref.root  # build the Python trie outside the timing, as upstream does in __init__
        py_t, py_ids = best_of(lambda: ref.encode(text), args.repeat)
        assert py_ids == ids
        rows.append(("ours (Python reference)", py_t, best_of(lambda: ref.decode(ids), args.repeat)[0]))

    if not os.path.exists(os.path.join(UPSTREAM, "rwkv", "rwkv_tokenizer.py")):
        sys.exit("upstream not installed in .upstream (run `make upstream`)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        code = f"REPO={REPO!r}\nUPSTREAM={UPSTREAM!r}\nTEXT={path!r}\nREPEAT={args.repeat}\n" + _CHILD
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if proc.returncode != 0:
        sys.exit("upstream run failed:\n" + proc.stderr[-3000:])
    up = json.loads(proc.stdout.strip().splitlines()[-1])
    assert up["n_tokens"] == len(ids) and up["ids_head"] == ids[:50], "upstream tokens differ"
    rows.append(("upstream 0.8.32 (Python)", up["encode"], up["decode"]))

    print(f"text: {n_bytes} bytes, {len(ids)} tokens; best of {args.repeat}")
    print(f"{'tokenizer':28s} {'encode s':>10s} {'MB/s':>8s} {'decode s':>10s}")
    for name, e, d in rows:
        print(f"{name:28s} {e:10.4f} {n_bytes / e / 1e6:8.2f} {d:10.4f}")
    print(f"encode speed-up vs upstream: {up['encode'] / enc_t:.1f}x   "
          f"decode speed-up vs upstream: {up['decode'] / dec_t:.1f}x")


if __name__ == "__main__":
    main()
