"""Child process for bench_model.py: times the upstream package (never imported with ours).

Started with ``python -I``; argv[1] is a JSON job. Prints one JSON line: decode_ms, prefill_tps.
"""

import json
import sys
import time

job = json.loads(sys.argv[1])
sys.path.insert(0, job["upstream"])

import torch  # noqa: E402

torch.set_num_threads(job["threads"])
from rwkv.model import RWKV  # noqa: E402  (upstream's)

path = job["path"][:-4] if job["v7"] and job["path"].endswith(".pth") else job["path"]
m = RWKV(path, job["strategy"]) if job["v7"] else RWKV(path, job["strategy"], verbose=False)
g = torch.Generator().manual_seed(0)
prompt = torch.randint(0, job["vocab"], (job["prefill"],), generator=g).tolist()
m.forward(prompt[:16], None)
t0 = time.perf_counter()
_, state = m.forward(prompt, None)
prefill_s = time.perf_counter() - t0
for t in prompt[:3]:
    _, state = m.forward([t], state)
times = []
for t in prompt[: job["decode"]]:
    t0 = time.perf_counter()
    _, state = m.forward([t], state)
    times.append(time.perf_counter() - t0)
times.sort()
print(json.dumps({"decode_ms": 1000 * times[len(times) // 2], "prefill_tps": job["prefill"] / prefill_s}))
