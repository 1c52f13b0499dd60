"""Helpers for the server tests and benchmark: start ``python -m rwkv serve`` in a subprocess on a
free loopback port, and a load generator of concurrent streaming clients."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "rwkv7-tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m rwkv serve ARGS`` on 127.0.0.1 and a free port, until ``stop()``."""

    def __init__(self, *args: str, timeout: float = 120.0, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "rwkv", "serve", "--port", str(self.port), *args],
                                     cwd=REPO, env={**os.environ, **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not answer /health within {timeout} s")
            time.sleep(0.3)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.stdout.read() if self.proc.stdout else ""


PROMPTS = [
    "The old man looked at the sea and said",
    '"I don\'t know," she said. "',
    "Once upon a time there was a little girl who",
    "He opened the door and",
    "The night was dark and the wind",
    "She laughed, and then",
    "In the morning the village",
    "They walked for hours until",
]


@dataclass
class LoadRequest:
    """One request of a load test: its body, and after how many chunks the client hangs up
    (None: reads to the end)."""

    body: dict
    hang_up_after: int | None = None
    text: str = ""
    chunks: int = 0
    status: int | None = None
    error: str | None = None
    ttft: float | None = None
    gaps: list = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0


def mixed_requests(n: int, seed: int = 0, *, hang_up_share: float = 0.1, max_tokens=(8, 64)) -> list:
    """n streaming completion/chat requests of mixed prompt lengths and parameters, about half
    greedy; a share of them hang up mid-stream."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = " ".join(rng.choice(PROMPTS) for _ in range(rng.randint(1, 6)))
        body = {"model": MODEL_NAME, "max_tokens": rng.randint(*max_tokens), "stream": True}
        if i % 2 == 0:
            body["temperature"] = 0
        else:
            body.update(temperature=rng.choice([0.5, 0.8, 1.0]), top_p=rng.choice([0.5, 0.9, 1.0]),
                        top_k=rng.choice([0, 20]), seed=rng.randint(0, 1000),
                        presence_penalty=rng.choice([0.0, 0.5]), frequency_penalty=rng.choice([0.0, 0.3]))
        if i % 3 == 0:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        hang = rng.randint(1, 4) if rng.random() < hang_up_share else None
        out.append(LoadRequest(body, hang))
    return out


async def run_one(client: httpx.AsyncClient, url: str, req: LoadRequest) -> None:
    path = "/v1/chat/completions" if "messages" in req.body else "/v1/completions"
    start = time.monotonic()
    last = None
    try:
        async with client.stream("POST", url + path, json=req.body) as r:
            req.status = r.status_code
            if r.status_code != 200:
                req.error = (await r.aread()).decode()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    req.error = chunk["error"]["message"]
                    return
                choice = chunk["choices"][0] if chunk["choices"] else {}
                piece = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.monotonic()
                    if last is None:
                        req.ttft = now - start
                    else:
                        req.gaps.append(now - last)
                    last = now
                    req.text += piece
                    req.chunks += 1
                if choice.get("finish_reason"):
                    req.finish_reason = choice["finish_reason"]
                if chunk.get("usage"):
                    req.completion_tokens = chunk["usage"]["completion_tokens"]
                if req.hang_up_after is not None and req.chunks >= req.hang_up_after:
                    return  # leaving the block closes the connection mid-stream
    except httpx.HTTPError as e:
        req.error = f"{type(e).__name__}: {e}"


async def run_load(url: str, requests: list, concurrency: int) -> float:
    """Run the requests with ``concurrency`` clients at a time; returns the wall time."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        async def one(req):
            async with sem:
                await run_one(client, url, req)
        start = time.monotonic()
        await asyncio.gather(*(one(r) for r in requests))
        return time.monotonic() - start

