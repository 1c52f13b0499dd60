"""Child process for bench_model.py: times the upstream package (never imported with ours).

Started with ``python -I``; argv[1] is a JSON job. Prints a JSON line for each step as it ends
({"event": ..., "wall": time.time(), ...}: the parent reads them when it stops a child that ran past
its time limit), then one JSON line: decode_ms, prefill_tps.
"""

import importlib.util
import json
import sys
import time
from pathlib import Path

job = json.loads(sys.argv[1])
# -I leaves this folder off sys.path (so our rwkv cannot shadow upstream's): load the shared
# timing code by its path.
_spec = importlib.util.spec_from_file_location("_timing", Path(__file__).resolve().parent / "_timing.py")
_timing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_timing)
sys.path.insert(0, job["upstream"])

import torch  # noqa: E402

torch.set_num_threads(job["threads"])
from rwkv.model import RWKV  # noqa: E402  (upstream's)

path = job["path"][:-4] if job["v7"] and job["path"].endswith(".pth") else job["path"]
m = RWKV(path, job["strategy"]) if job["v7"] else RWKV(path, job["strategy"], verbose=False)


def progress(event: str, **fields) -> None:
    print(json.dumps({"event": event, "wall": time.time(), **fields}), flush=True)


print(json.dumps(_timing.time_model(m, job["vocab"], job["prefill"], job["decode"], progress)))
