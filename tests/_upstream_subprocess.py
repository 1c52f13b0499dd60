"""Run a snippet against the isolated upstream ``rwkv`` 0.8.32 in a subprocess (tokenizer/pipeline tests).

The child has ``.upstream`` first on ``sys.path`` and never sees this repository (same package name).
The snippet reads ``PAYLOAD`` (JSON-decoded) and assigns ``RESULT`` (JSON-encodable). Bytes travel
as latin-1 strings: use ``b2s``/``s2b`` on both sides.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPSTREAM = os.path.join(REPO, ".upstream")

_PRELUDE = r'''
import json, os, sys
sys.path[:] = [p for p in sys.path if p not in ('', '.') and os.path.abspath(p) != REPO]
sys.path.insert(0, UPSTREAM)
import rwkv
assert os.path.abspath(rwkv.__file__).startswith(UPSTREAM), rwkv.__file__
def b2s(b): return b.decode('latin-1')
def s2b(s): return s.encode('latin-1')
PAYLOAD = json.loads(sys.stdin.read())
'''


def b2s(b):
    return bytes(b).decode("latin-1")


def s2b(s):
    return s.encode("latin-1")


def upstream_available():
    return os.path.exists(os.path.join(UPSTREAM, "rwkv", "utils.py"))


def run_upstream(snippet, payload=None, timeout=600):
    """Execute ``snippet`` with upstream's package importable as ``rwkv``; return its ``RESULT``."""
    if not upstream_available():
        pytest.skip("upstream rwkv 0.8.32 is not installed in .upstream (run `make upstream`)")
    code = (f"REPO = {REPO!r}\nUPSTREAM = {UPSTREAM!r}\n" + _PRELUDE + snippet
            + "\nsys.stdout.write('\\n@@RESULT@@' + json.dumps(RESULT))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"upstream subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.rsplit("\n@@RESULT@@", 1)[1])
