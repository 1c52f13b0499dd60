"""Per-token sampling cost: ours vs upstream 0.8.32's ``PIPELINE.sample_logits`` on the same logits
and seeds (the same tokens, checked), and the presence/frequency penalty step of ``generate`` after a
few hundred distinct tokens, in the same run.

    .venv/bin/python benchmarks/bench_sampling.py [--calls 300]

Logits: the World vocabulary's 65536 entries, "peaked" (a trained model's shape: Zipf-like, a small
nucleus at top_p 0.7) and "flat" (a random-weight model's: most of the vocabulary in the nucleus).
Upstream runs in a subprocess with ``.upstream`` first on sys.path. Median microseconds per call.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
UPSTREAM = os.path.join(REPO, ".upstream")

# The same job in both processes: SAMPLER(logits) and the penalty step, timed per call.
_JOB = r'''
import time, statistics
import numpy as np
import torch

def median_us(fn, calls):
    fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6

def run(sample, penalise, cases, occurrence, calls):
    out = {}
    for name, logits in cases.items():
        np.random.seed(1234)
        tokens = [sample(logits.clone()) for _ in range(50)]
        out[name] = {"us": median_us(lambda: sample(logits.clone()), calls), "tokens": tokens}
    base = cases["peaked"]
    out["penalties"] = {"us": median_us(lambda: penalise(base.clone(), occurrence), calls)}
    return out
'''

_CHILD = r'''
import json, os, sys
sys.path[:] = [p for p in sys.path if p not in ('', '.') and os.path.abspath(p) != REPO]
sys.path.insert(0, UPSTREAM)
import numpy as np, torch
import rwkv
assert os.path.abspath(rwkv.__file__).startswith(UPSTREAM), rwkv.__file__
from rwkv.utils import PIPELINE, PIPELINE_ARGS
exec(JOB)
data = np.load(CASES)
cases = {k: torch.from_numpy(data[k]) for k in data.files if k != "occ_ids"}
occurrence = {int(n): float(c) for n, c in zip(data["occ_ids"][0], data["occ_ids"][1])}
pipe = PIPELINE(None, "rwkv_vocab_v20230424")
args = PIPELINE_ARGS(temperature=1.0, top_p=0.7, alpha_frequency=0.25, alpha_presence=0.25)

def penalise(out, occurrence):  # upstream generate's own loop
    for n in occurrence:
        out[n] -= (args.alpha_presence + occurrence[n] * args.alpha_frequency)

print(json.dumps(run(lambda l: pipe.sample_logits(l, temperature=1.0, top_p=0.7), penalise, cases,
                     occurrence, CALLS)))
'''


def make_cases(seed=0):
    rs = np.random.RandomState(seed)
    peaked = (-1.1 * np.log(rs.permutation(65536) + 1.0)).astype(np.float32)
    flat = (rs.randn(65536) * 0.3).astype(np.float32)
    occ_ids = rs.choice(65536, 300, replace=False)
    counts = rs.rand(300) * 3
    return {"peaked": peaked, "flat": flat, "occ_ids": np.stack([occ_ids.astype(np.float64), counts])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="timed calls per figure (median kept)")
    args = ap.parse_args()
    if not os.path.isdir(UPSTREAM):
        sys.exit(f"upstream package not found at {UPSTREAM}: run `make upstream` first")

    import torch
    from rwkv.generation import apply_penalties
    from rwkv.utils import PIPELINE, PIPELINE_ARGS

    torch.set_num_threads(2)
    arrays = make_cases()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cases.npz")
        np.savez(path, **arrays)
        code = (f"REPO = {REPO!r}\nUPSTREAM = {UPSTREAM!r}\nCASES = {path!r}\nCALLS = {args.calls}\n"
                f"JOB = {_JOB!r}\n" + _CHILD)
        env = dict(os.environ, OMP_NUM_THREADS="2")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              cwd=tmp)
    if proc.returncode != 0:
        sys.exit(f"upstream run failed:\n{proc.stderr[-3000:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])

    namespace = {}
    exec(_JOB, namespace)
    cases = {k: torch.from_numpy(v) for k, v in arrays.items() if k != "occ_ids"}
    occurrence = {int(n): float(c) for n, c in zip(arrays["occ_ids"][0], arrays["occ_ids"][1])}
    pipe = PIPELINE(None, "rwkv_vocab_v20230424")
    pargs = PIPELINE_ARGS(temperature=1.0, top_p=0.7, alpha_frequency=0.25, alpha_presence=0.25)

    ours = namespace["run"](lambda l: pipe.sample_logits(l, temperature=1.0, top_p=0.7),
                            lambda out, occ: apply_penalties(out, occ, pargs), cases, occurrence,
                            args.calls)
    print(f"sampling, 65536-entry logits, top_p 0.7, torch {torch.__version__}, "
          f"numpy {np.__version__}, median of {args.calls} calls")
    print(f"{'case':<12}{'ours us':>10}{'upstream us':>13}{'x':>7}  same tokens")
    for name in ("peaked", "flat", "penalties"):
        o, t = ours[name]["us"], theirs[name]["us"]
        same = "" if name == "penalties" else str(ours[name]["tokens"] == theirs[name]["tokens"])
        print(f"{name:<12}{o:>10.1f}{t:>13.1f}{t / o:>7.2f}  {same}")
    if any(ours[n]["tokens"] != theirs[n]["tokens"] for n in ("peaked", "flat")):
        sys.exit("the sampled tokens differ from upstream's")


if __name__ == "__main__":
    main()
