"""Programs: the chat session logic (fake model: only new tokens are fed on later turns and on retry),
``python -m rwkv chat|generate|convert`` end to end with real tiny models and piped stdin, the
tokenizer chosen beside a checkpoint and the check that it fits the model."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from _fake_model import FakeModel

from rwkv.cli import COMMANDS
from rwkv.cli.chat import ChatSession
from rwkv.cli.common import SHIPPED_MODEL, WORLD, CliError, vocab_for
from rwkv.utils import PIPELINE, PIPELINE_ARGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def session():
    pipe = PIPELINE(FakeModel(65536, boost=[261]), "rwkv_vocab_v20230424")  # '\n\n' is frequent
    args = PIPELINE_ARGS(temperature=1.0, top_p=0.5, token_stop=[0])
    return ChatSession(pipe, args, max_tokens=40, generator=np.random.RandomState(0))


def _say(session, text):
    turn = session.send(text) if text is not None else session.retry()
    reply = "".join(turn)
    return reply, turn.result


def test_second_turn_feeds_only_new_tokens(session):
    model = session.pipeline.model
    _, r1 = _say(session, "hello")
    assert r1.cached_tokens == 0 and model.fed == r1.prompt_tokens + len(r1.tokens)
    history = len(session.history)
    fed = model.fed
    _, r2 = _say(session, "and then?")
    new_prompt = r2.prompt_tokens - history
    assert r2.cached_tokens == history - (0 if r1.stop_reason == "stop_string" else 1)
    assert model.fed - fed == r2.prompt_tokens - r2.cached_tokens + len(r2.tokens)
    assert model.fed - fed <= new_prompt + 1 + len(r2.tokens)
    # retry: the prompt is entirely cached; only the new reply's tokens go through the model
    fed = model.fed
    _, r3 = _say(session, None)
    assert r3.cached_tokens == r3.prompt_tokens == r2.prompt_tokens
    assert model.fed - fed == len(r3.tokens)


def test_reset_and_retry_without_history(session):
    with pytest.raises(CliError, match="nothing to retry"):
        session.retry()
    _say(session, "hi")
    assert session.history
    session.reset()
    assert session.history == [] and session.last_prompt is None
    reply, res = _say(session, "line one\\nline two")  # literal \n becomes a newline in the prompt
    assert session.pipeline.encode("User: line one\nline two\n\nAssistant:") == session.last_prompt
    assert "\n\n" not in reply and res.text == reply


# ------------------------------------------------------------------------------ the programs
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    make_tiny = pytest.importorskip("tests.fixtures.make_tiny_models")
    path = tmp_path_factory.mktemp("cli") / "tiny-5.2.pth"
    make_tiny.save_checkpoint(str(path), make_tiny.make_checkpoint("5.2", n_layer=2, n_embd=64,
                                                                       vocab=65536, seed=0))
    return str(path)


def _run(args, stdin=""):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "rwkv"] + args, input=stdin, capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)


def test_chat_program_with_piped_stdin(tiny):
    script = "hello there\nhow are you\n+retry\n+reset\nagain\n/quit\nnever read\n"
    out = _run(["chat", "--model", tiny, "--strategy", "cpu fp32", "--seed", "1", "--max-tokens", "12",
                "--stats"], script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("Assistant:") == 4 and "[conversation reset]" in out.stdout
    stats = [dict(kv.split("=") for kv in line.split()[1:]) for line in out.stderr.splitlines()
             if line.startswith("[stats]")]
    assert len(stats) == 4
    s1, s2, s3, s4 = [{k: (int(v) if v.isdigit() else v) for k, v in s.items()} for s in stats]
    history1 = s1["prompt"] + s1["generated"] + (0 if s1["stop"] == "stop_string" else 1)
    assert s1["cached"] == 0 and s1["fed"] == s1["prompt"] + s1["generated"]
    # turn 2 feeds only its own new tokens (plus the separator when turn 1 hit the length limit)
    assert s2["cached"] >= s1["prompt"] + s1["generated"]
    assert s2["fed"] == s2["prompt"] - s2["cached"] + s2["generated"]
    assert s2["prompt"] - s2["cached"] <= s2["prompt"] - history1 + 1
    # +retry: prompt fully cached
    assert s3["cached"] == s3["prompt"] == s2["prompt"] and s3["fed"] == s3["generated"]
    # after +reset the conversation starts over (the first turn's cached prefix is no longer a prefix)
    assert s4["prompt"] < s2["prompt"]


def test_generate_program_is_repeatable_with_a_seed(tiny):
    base = ["generate", "--model", tiny, "--prompt", "Hello", "--tokens", "16", "--seed", "7",
            "--temperature", "1.0", "--top_p", "0.9"]
    a, b = _run(base), _run(base)
    assert a.returncode == 0 and b.returncode == 0, a.stderr
    assert a.stdout == b.stdout and len(a.stdout.strip()) > 0


def test_programs_report_errors_without_traceback(tiny, tmp_path):
    out = _run(["generate", "--model", str(tmp_path / "missing.pth"), "--prompt", "x"])
    assert out.returncode == 2 and out.stderr.startswith("error: cannot load model")
    assert "Traceback" not in out.stderr
    out = _run(["generate", "--model", tiny, "--prompt", "x", "--vocab", "no_such_vocab"])
    assert out.returncode == 2 and "Accepted:" in out.stderr and "Traceback" not in out.stderr
    out = _run([])
    assert out.returncode == 2 and re.search(r"chat|generate", out.stdout)


# ------------------------------------------------------------ the shipped model and its tokenizer
needs_shipped = pytest.mark.skipif(not SHIPPED_MODEL.with_suffix(".pth").exists(),
                                   reason="the shipped model is not in this checkout")


@needs_shipped
def test_chat_with_the_shipped_model_uses_the_tokenizer_beside_it():
    # Its vocabulary has 2048 entries: the World vocabulary's ids would be out of range.
    for args in (["--model", "models/rwkv7-tiny/rwkv7-tiny"], []):  # explicit, and the default
        out = _run(["chat", *args, "--max-tokens", "8", "--seed", "0", "--stats"], "Hello there\n/quit\n")
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("Assistant:") == 1 and "error" not in out.stdout
        assert "[stats] prompt=" in out.stderr


@needs_shipped
def test_a_tokenizer_that_does_not_fit_the_model_is_refused_at_start():
    out = _run(["chat", "--vocab", WORLD], "never read\n")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: the tokenizer 'rwkv_vocab_v20230424' has 65530 tokens")
    assert "vocabulary of 2048 (ids 0..2047)" in out.stderr and "Pass --vocab" in out.stderr
    assert "Assistant:" not in out.stdout


def test_the_tokenizer_beside_a_checkpoint_is_the_default(tmp_path):
    ckpt = tmp_path / "m.pth"
    assert vocab_for(ckpt) == WORLD  # nothing beside it
    (tmp_path / "tokenizer.json").write_text("{}")
    assert vocab_for(ckpt) == str(tmp_path / "tokenizer.json")
    assert vocab_for(tmp_path / "m") == str(tmp_path / "tokenizer.json")  # .pth left out, as RWKV takes it
    assert vocab_for(ckpt, "cl100k_base") == "cl100k_base"  # an explicit --vocab wins


def test_convert_writes_a_file_the_model_loads_and_returns(tiny, tmp_path):
    import torch

    from rwkv.__main__ import main
    from rwkv.model import RWKV
    out = tmp_path / "tiny-i8"
    # In process: main returns its status (no SystemExit), as upstream's convert_and_save_and_exit does not.
    assert main(["convert", "--model", tiny, "--strategy", "cpu fp32i8", "--output", str(out)]) == 0
    assert (tmp_path / "tiny-i8.pth").exists()
    direct = RWKV(tiny, "cpu fp32i8", verbose=False)
    converted = RWKV(str(out), "cpu fp32i8", verbose=False)
    a, _ = direct.forward([1, 2, 3], None)
    b, _ = converted.forward([1, 2, 3], None)
    assert torch.equal(a, b)
    assert main(["convert", "--model", str(tmp_path / "missing"), "--strategy", "cpu fp32", "-o",
                 str(tmp_path / "x")]) == 2
    assert main(["convert", "--model", tiny]) == 2  # no --output: argparse's error, reported, not raised


def test_every_listed_command_has_a_program():
    from rwkv.__main__ import build_parser
    parser = build_parser()
    required = {"convert": ["--model", "m", "-o", "o"], "generate": ["--prompt", "p"]}
    for name in COMMANDS:
        ns = parser.parse_args([name] + required.get(name, []))
        assert callable(ns.run), name
