"""The server as Ray Serve replicas (``python -m rwkv serve --ray --replicas 2``): a local Ray
instance on 127.0.0.1, requests through Ray Serve's HTTP proxy, the same load test as the
single-process server's."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("ray.serve")

from tests.serve_client import ServerProcess, mixed_requests, run_load  # noqa: E402


def test_two_replicas_serve_the_load_test():
    s = ServerProcess("--ray", "--replicas", "2", "--max-batch", "32", "--max-tokens", "512",
                      "--replica-cpus", "0.5", timeout=240)
    try:
        reqs = mixed_requests(240, seed=2, hang_up_share=0.1)
        asyncio.run(run_load(s.url, reqs, concurrency=40))
        failed = [(r.status, r.error) for r in reqs if r.status != 200 or r.error]
        assert not failed, failed[:5]
        assert all(r.finish_reason in ("stop", "length") for r in reqs if r.hang_up_after is None)
        # Greedy requests give the same text as on one replica (the same model in each).
        greedy = [r for r in reqs if r.hang_up_after is None and r.body.get("temperature") == 0]
        texts = {}
        for r in greedy:
            texts.setdefault((r.body.get("prompt") or r.body["messages"][0]["content"], r.body["max_tokens"],
                              "messages" in r.body), set()).add(r.text)
        assert all(len(t) == 1 for t in texts.values())
        bad = httpx.post(s.url + "/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=30)
        assert bad.status_code == 404 and "does not exist" in bad.json()["error"]["message"]
    finally:
        out = s.stop()
    assert "Traceback" not in out, out[-3000:]
