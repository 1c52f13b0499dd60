"""Run a Python snippet in a child process with this checkout importable (for cases that could kill
the process: a SIGBUS from a rewritten mapped file, a crash in native code)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_child(code: str, *args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``code`` with ``sys.argv[1:] = args``; returns the finished process (stdout/stderr text).
    A child killed by a signal has a negative ``returncode`` (-7 is SIGBUS)."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=timeout)


def describe(proc: subprocess.CompletedProcess) -> str:
    """The exit status in words plus the end of stderr, for assertion messages."""
    rc = proc.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
    return f"{how}\n--- stderr ---\n{proc.stderr[-3000:]}"
