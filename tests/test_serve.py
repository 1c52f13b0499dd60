"""The OpenAI-compatible server (rwkv/serve/), started as the README says (``python -m rwkv serve``
in a subprocess, the shipped model), driven by the official ``openai`` client and raw HTTP."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.serve_client import MODEL_NAME, LoadRequest, ServerProcess, mixed_requests, run_load, run_one  # noqa: E402


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-batch", "32", "--max-tokens", "512")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def pipeline():
    from rwkv.model import RWKV
    from rwkv.utils import PIPELINE

    model = RWKV("models/rwkv7-tiny/rwkv7-tiny", "cpu fp32", verbose=False)
    return PIPELINE(model, "models/rwkv7-tiny/tokenizer.json")


def greedy_generate(pipeline, prompt: str, n: int) -> str:
    from rwkv.utils import PIPELINE_ARGS

    args = PIPELINE_ARGS(temperature=0, top_p=0, alpha_frequency=0, alpha_presence=0, token_stop=[0])
    return pipeline.generate(prompt, token_count=n, args=args)


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    h = server.health()
    assert h["status"] == "ok" and h["max_batch"] == 32


@pytest.mark.parametrize("prompt", ["The old man looked at the sea and said", '"Where are you going?" she asked.'])
def test_greedy_completion_equals_pipeline_generate(client, pipeline, prompt):
    want = greedy_generate(pipeline, prompt, 40)
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0)
    assert r.choices[0].text == want
    assert r.usage.prompt_tokens == len(pipeline.encode(prompt))
    reason = r.choices[0].finish_reason  # "stop": the model's end-of-text token came first
    assert (reason, r.usage.completion_tokens == 40) in (("length", True), ("stop", False))
    streamed = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want


def test_chat_streaming_and_not(client):
    msgs = [{"role": "system", "content": "You are a storyteller."},
            {"role": "user", "content": "Tell me about the sea."}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=20, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and text and text == text.lstrip()
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens and not chunks[-1].choices


def test_seeded_requests_repeat_and_stop_strings_cut(client):
    kw = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=30, temperature=1.0, top_p=0.9)
    a = client.completions.create(seed=7, **kw).choices[0].text
    b = client.completions.create(seed=7, **kw).choices[0].text
    others = {client.completions.create(seed=s, **kw).choices[0].text for s in (8, 9, 10)}
    assert a == b and len(others | {a}) > 1
    full = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=40,
                                     temperature=0).choices[0].text
    stop = full[10:14]
    r = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=40, temperature=0,
                                  stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_logit_bias_and_penalties_change_the_choice(client, pipeline):
    base = client.completions.create(model=MODEL_NAME, prompt="He opened the door and", max_tokens=1, temperature=0)
    first = pipeline.encode(base.choices[0].text)[0]
    r = client.completions.create(model=MODEL_NAME, prompt="He opened the door and", max_tokens=1, temperature=0,
                                  logit_bias={str(first): -100})
    assert r.choices[0].text != base.choices[0].text
    plain = client.completions.create(model=MODEL_NAME, prompt="I'm not sure", max_tokens=40, temperature=0)
    pen = client.completions.create(model=MODEL_NAME, prompt="I'm not sure", max_tokens=40, temperature=0,
                                    frequency_penalty=2.0, presence_penalty=2.0)
    assert pen.choices[0].text != plain.choices[0].text


BAD = [  # (path, body or raw bytes, status, message pattern)
    ("/v1/completions", b"{bad json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "JSON object|valid dictionary"),
    ("/v1/completions", {"model": MODEL_NAME}, 400, "'prompt' is required"),
    ("/v1/completions", {"prompt": "hi"}, 400, "'model' is required"),
    ("/v1/completions", {"model": "gpt-9", "prompt": "hi"}, 404, "model 'gpt-9' does not exist"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": ""}, 400, "prompt is empty"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": "5"}, 400, "max_tokens.*integer"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens.*greater"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 513}, 400, "above this server's limit"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "top_k": -3}, 400, "top_k"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "presence_penalty": 9}, 400, "presence_penalty"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "logit_bias": {"x": 1}}, 400, "token ids"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "logit_bias": {"99999": 1}}, 400, "out of range"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "logit_bias": {"1": 500}}, 400, "logit_bias"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "n": 2}, 400, "n > 1"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "echo": True}, 400, "echo"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "seed": "x"}, 400, "seed"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": [1, 99999]}, 400, "token id 99999"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": ["a", "b"]}, 400, "one prompt per request"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "word " * 9000}, 400, "above this server's limit"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/nowhere", {}, 404, "Not Found"),
]


@pytest.mark.parametrize("path,body,status,pattern", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_errors(server, path, body, status, pattern):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + path, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert re.search(pattern, err["message"]), err
    assert set(err) == {"message", "type", "param", "code"}


def test_oversized_body_is_refused(server):
    r = httpx.post(server.url + "/v1/completions", content=b"x" * (64 << 20),
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_load_with_disconnects(server, client):
    """40 concurrent streaming clients, 240 requests of mixed lengths and parameters, a tenth
    hanging up mid-stream: nothing fails, every greedy output equals the same request served
    alone, and afterwards the server answers and holds no sequence."""
    reqs = mixed_requests(240, seed=1, hang_up_share=0.1)
    asyncio.run(run_load(server.url, reqs, concurrency=40))
    failed = [(r.status, r.error) for r in reqs if r.status != 200 or r.error]
    assert not failed, failed[:5]
    done = [r for r in reqs if r.hang_up_after is None]
    assert all(r.finish_reason in ("stop", "length") for r in done)
    assert sum(r.hang_up_after is not None for r in reqs) >= 10
    greedy = [r for r in done if r.body.get("temperature") == 0][:60]

    async def alone():
        async with httpx.AsyncClient(timeout=300) as c:
            for r in greedy:
                again = LoadRequest(dict(r.body))
                await run_one(c, server.url, again)
                assert again.text == r.text, (r.body, r.text, again.text)
    asyncio.run(alone())
    deadline = time.monotonic() + 10
    while server.health()["active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    h = server.health()
    assert h["active"] == 0 and h["waiting"] == 0 and h["free_slots"] == 32
    metrics = httpx.get(server.url + "/metrics").text
    assert re.search(r"rwkv_generated_tokens_total [1-9]", metrics)
    assert "rwkv_time_to_first_token_seconds_count" in metrics


def test_prefix_cache_reuses_conversation_turns(server, client):
    def cached():
        text = httpx.get(server.url + "/metrics").text
        return float(re.search(r"^rwkv_cached_prompt_tokens_total (\S+)", text, re.M).group(1))

    system = {"role": "system", "content": "You answer in one short sentence about boats and the sea. " * 4}
    before = cached()
    client.chat.completions.create(model=MODEL_NAME, messages=[system, {"role": "user", "content": "Hi."}],
                                   max_tokens=3, temperature=0)
    after_first = cached()
    client.chat.completions.create(model=MODEL_NAME, messages=[system, {"role": "user", "content": "Why?"}],
                                   max_tokens=3, temperature=0)
    assert after_first == before and cached() - after_first >= 40  # the system prompt's tokens


def test_full_queue_answers_429_and_recovers():
    s = ServerProcess("--max-batch", "1", "--max-queue", "1", "--max-tokens", "100000", "--cache-mb", "0")
    try:
        # (the end-of-text token banned, so that the requests run until they are dropped)
        long = {"model": MODEL_NAME, "prompt": "The sea", "max_tokens": 100000, "stream": True,
                "logit_bias": {"0": -100}}
        first = LoadRequest(long, hang_up_after=None)
        second = LoadRequest(dict(long))
        loop = asyncio.new_event_loop()

        async def fill():
            async with httpx.AsyncClient(timeout=300) as c:
                t1 = asyncio.create_task(run_one(c, s.url, first))
                await asyncio.sleep(1.0)
                t2 = asyncio.create_task(run_one(c, s.url, second))
                await asyncio.sleep(1.0)
                r = await c.post(s.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 2})
                t1.cancel()
                t2.cancel()
                await asyncio.gather(t1, t2, return_exceptions=True)
                return r
        r = loop.run_until_complete(fill())
        loop.close()
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        deadline = time.monotonic() + 15  # the two hung-up requests leave; the server serves again
        while (s.health()["active"] or s.health()["waiting"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        ok = httpx.post(s.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200 and s.health()["free_slots"] == 1
    finally:
        s.stop()


def generated(s) -> float:
    text = httpx.get(s.url + "/metrics", timeout=10).text
    return float(re.search(r"^rwkv_generated_tokens_total (\S+)", text, re.M).group(1))


def test_non_streaming_client_that_leaves_frees_its_slot():
    s = ServerProcess("--max-batch", "2", "--max-tokens", "100000")
    try:
        def leave():
            try:
                httpx.post(s.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "The sea",
                                                             "max_tokens": 100000, "logit_bias": {"0": -100}},
                           timeout=1.0)
            except httpx.TimeoutException:
                pass
        t = threading.Thread(target=leave)
        t.start()
        t.join()
        deadline = time.monotonic() + 10
        while s.health()["active"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.health()["active"] == 0  # 100000 tokens would take minutes: it was dropped
        made = generated(s)
        time.sleep(0.5)
        assert made > 0 and generated(s) == made  # it had run, and nothing runs on for it
    finally:
        s.stop()
