"""PIPELINE / PIPELINE_ARGS surface: tokenizer selection and its errors, import isolation, no sys.path
mutation, strict decode, logits validation against the model's vocabulary, empty prompts."""

import os
import subprocess
import sys
import types

import pytest
import torch

from rwkv.utils import PIPELINE, PIPELINE_ARGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER_20B = "/work/shared/data/20B_tokenizer.json"


def _fake_model(vocab, favourite=98):
    class M:
        args = types.SimpleNamespace(vocab_size=vocab, n_layer=1, n_embd=4)

        def forward(self, tokens, state, full_output=False):
            out = torch.zeros(vocab)
            out[favourite] = 10.0  # World id 98 is 'a'
            return out, state or [torch.zeros(1)]
    return M()


def test_pipeline_args_defaults_and_positional_order():
    a = PIPELINE_ARGS()
    assert vars(a) == dict(temperature=1.0, top_p=0.85, top_k=0, alpha_frequency=0.2, alpha_presence=0.2,
                           alpha_decay=0.996, token_ban=[], token_stop=[], chunk_len=256)
    b = PIPELINE_ARGS(0.5, 0.3, 4, 0.1, 0.2, 0.9, [1], [2], 64)
    assert (b.temperature, b.top_p, b.top_k, b.alpha_decay, b.token_ban, b.token_stop, b.chunk_len) == \
        (0.5, 0.3, 4, 0.9, [1], [2], 64)
    assert PIPELINE_ARGS().token_ban is PIPELINE_ARGS().token_ban  # upstream's shared default list


def test_import_does_not_load_model_module():
    code = ("import sys, rwkv, rwkv.utils, rwkv.rwkv_tokenizer\n"
            "assert 'rwkv.model' not in sys.modules, sorted(m for m in sys.modules if m.startswith('rwkv'))\n"
            "import rwkv.generation, rwkv.state_io\n"
            "assert 'rwkv.model' not in sys.modules\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_world_pipeline_does_not_touch_sys_path():
    before = list(sys.path)
    pipe = PIPELINE(None, "rwkv_vocab_v20230424")
    assert sys.path == before
    assert type(pipe.tokenizer).__module__ == "rwkv.rwkv_tokenizer"
    assert pipe.encode("Hello world") == [33155, 40213]
    assert pipe.encode("") == []


def test_unknown_word_name_says_what_is_accepted(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        PIPELINE(None, "rwkv_vocab_v20230425")
    msg = str(info.value)
    assert "'rwkv_vocab_v20230424'" in msg and "cl100k_base" in msg and "20B_tokenizer.json" in msg
    with pytest.raises(FileNotFoundError):
        PIPELINE(None, str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizers JSON file"):
        PIPELINE(None, str(bad))


def test_world_format_txt_path_is_accepted(tmp_path):
    path = tmp_path / "tiny_vocab.txt"
    path.write_text("1 'a' 1\n2 'b' 1\n3 'ab' 2\n", encoding="utf-8")
    pipe = PIPELINE(None, str(path))
    assert pipe.encode("abba") == [3, 2, 1]


def test_cl100k_without_tiktoken_is_a_clear_import_error(monkeypatch):
    try:
        import tiktoken  # noqa: F401
        pytest.skip("tiktoken is installed")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="pip install tiktoken"):
        PIPELINE(None, "cl100k_base")


def test_strict_decode_world_and_20b():
    world = PIPELINE(None, "rwkv_vocab_v20230424")
    assert world.decode([33, 0]) == "\ufffd"
    with pytest.raises(ValueError, match="token id 0 at position 1"):
        world.decode([33, 0], strict=True)
    if not os.path.exists(TOKENIZER_20B):
        pytest.skip("20B tokenizer missing")
    neox = PIPELINE(None, TOKENIZER_20B)
    # Upstream drops this id silently (and raises OverflowError for -1): ours is a ValueError either way.
    with pytest.raises(ValueError, match=r"token id 50282 at position 0 is outside .* 0\.\.50276"):
        neox.decode([50277 + 5])
    with pytest.raises(ValueError, match=r"token id 50282 at position 1 is outside .* 0\.\.50276"):
        neox.decode([187, 50282], strict=True)
    with pytest.raises(ValueError, match="token id -1"):
        neox.decode([-1], strict=True)
    with pytest.raises(ValueError, match="token id 'a'"):
        neox.decode(["a"], strict=True)
    np = pytest.importorskip("numpy")
    assert neox.decode(np.array([187, 187]), strict=True) == "\n\n"
    assert neox.decode(neox.encode("Hello\n\nworld"), strict=True) == "Hello\n\nworld"


def test_sample_logits_checks_the_model_vocabulary():
    pipe = PIPELINE(_fake_model(100), "rwkv_vocab_v20230424")
    assert pipe.model_vocab_size() == 100
    with pytest.raises(ValueError, match="logits have 99 entries but the vocabulary has 100"):
        pipe.sample_logits(torch.zeros(99))
    with pytest.raises(ValueError, match="1-D"):
        pipe.sample_logits(torch.zeros(1, 100))
    with pytest.raises(ValueError, match="NaN"):
        pipe.sample_logits(torch.full((100,), float("nan")))
    logits = torch.zeros(100)
    logits[42] = 10
    assert pipe.sample_logits(logits, temperature=0) == 42
    # the vocabulary size also comes from model.w['emb.weight'] when args has none
    m = types.SimpleNamespace(args=types.SimpleNamespace(), w={"emb.weight": torch.zeros(7, 2)})
    assert PIPELINE(m, "rwkv_vocab_v20230424").model_vocab_size() == 7
    assert PIPELINE(None, "rwkv_vocab_v20230424").model_vocab_size() is None


def test_generate_with_empty_prompt_is_a_value_error_and_zero_count_is_empty():
    pipe = PIPELINE(_fake_model(300), "rwkv_vocab_v20230424")
    with pytest.raises(ValueError, match="prompt encodes to no tokens"):
        pipe.generate("", token_count=5)
    assert pipe.generate("", token_count=0) == ""
    assert pipe.generate("hi", token_count=3, args=PIPELINE_ARGS(temperature=0)) == "aaa"
