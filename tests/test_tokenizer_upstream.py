"""World tokenizer vs upstream 0.8.32 (one subprocess, one batch): encode, encodeBytes, decode,
decodeBytes and printTokens on tricky strings, thousands of random strings and random byte sequences.
Both our C++ fast path and our pure-Python reference are checked against upstream's output."""

import io
import contextlib
import random

import pytest

from _upstream_subprocess import b2s, run_upstream, s2b
from rwkv.rwkv_tokenizer import TRIE_TOKENIZER, WORLD_VOCAB_FILE

TRICKY = [
    "", " ", "  ", "\n", "\n\n", "\n\n\n", "\r\n", "\t\t x", "Hello world", "User: hi\n\nAssistant:",
    "你好", "你好，世界！", "日本語のテキスト", "한국어 문장", "Привет, мир", "مرحبا بالعالم", "שלום",
    "😀", "👩‍👩‍👧‍👦", "🇯🇵🇫🇷", "e\u0301", "\u200b\u200d\ufeff", "\u3000\u3000全角", "A\x00B", "\x01\x02\x1f\x7f",
    "tab\tsep\tvalues", "    indented code():\n        return 1", "x" * 1000, " " * 300, "\n" * 50,
    "混合 mixed テキスト 123 😀 ok", "1234567890" * 20, "<|endoftext|>", "\\n literal backslash",
    "\ud7ff\ue000\uffff", "\U0010ffff", "Ω≈ç√∫˜µ≤≥÷", "The quick brown fox jumps over the lazy dog. " * 5,
]

_ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r  ",
    ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`", "你好世界中文字符测试的一是不了人我在有他这为之大来以个中上们",
    "ひらがなカタカナ漢字", "абвгдеёжзийклмнопрстуфхцчшщъыьэюя", "αβγδεζηθικλμνξοπρστυφχψω",
    "😀😁😂🤣😃😄😅😆😉😊🙂🙃👍🏽❤️🚀", "\x00\x01\x07\x08\x0b\x0c\x1b\x7f\x80\x9f", "\u0301\u0308\u200d\ufe0f",
]


def _random_strings(rng, n):
    out = []
    for _ in range(n):
        alphabet = "".join(rng.sample(_ALPHABETS, rng.randint(1, 4)))
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))))
    return out


def _random_bytes(rng, n):
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))))
        else:  # valid UTF-8 cut at a random byte: partial characters at the end
            b = "".join(rng.choice("aé你😀 \n") for _ in range(rng.randint(1, 12))).encode()
            out.append(b[:rng.randint(0, len(b))])
    return out


def _random_id_lists(rng, n):
    special = [0, -1, 65530, 65535, 65536, 10**12, 256, 257, 11, 261]
    out = []
    for _ in range(n):
        ids = [rng.randint(1, 65529) if rng.random() < 0.5 else rng.randint(1, 300)
               for _ in range(rng.randint(0, 8))]
        if rng.random() < 0.2 and ids:
            ids[rng.randrange(len(ids))] = rng.choice(special)
        out.append(ids)
    return out


_SNIPPET = r'''
import io, contextlib
from rwkv.rwkv_tokenizer import TRIE_TOKENIZER
tok = TRIE_TOKENIZER(os.path.join(UPSTREAM, 'rwkv', 'rwkv_vocab_v20230424.txt'))
def dec_bytes(ids):
    try:
        return b2s(tok.decodeBytes(ids))
    except KeyError as e:
        return ['KeyError', repr(e.args[0])]
def printed(ids):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        tok.printTokens(ids)
    return buf.getvalue()
RESULT = {
    'encode': [tok.encode(s) for s in PAYLOAD['strings']],
    'encode_bytes': [tok.encodeBytes(s2b(b)) for b in PAYLOAD['bytes']],
    'decode': [tok.decode(ids) for ids in PAYLOAD['ids']],
    'decode_bytes': [dec_bytes(ids) for ids in PAYLOAD['ids']],
    'decode_of_encoded_bytes': [tok.decode(tok.encodeBytes(s2b(b))) for b in PAYLOAD['bytes']],
    'print': [printed(ids) for ids in PAYLOAD['print_ids']],
    'sizes': [len(tok.idx2token), len(tok.token2idx), min(tok.idx2token), max(tok.idx2token)],
}
'''


@pytest.fixture(scope="module")
def corpus():
    rng = random.Random(20230424)
    strings = TRICKY + _random_strings(rng, 3000)
    byte_seqs = _random_bytes(rng, 3000)
    id_lists = _random_id_lists(rng, 2000) + [[], [0], [33, 0], [33, 34]]
    print_ids = [[], [33155, 40213], [10464, 11685], [129, 200, 300], [1, 11, 261]]
    payload = {"strings": strings, "bytes": [b2s(b) for b in byte_seqs], "ids": id_lists,
               "print_ids": print_ids}
    return payload, run_upstream(_SNIPPET, payload)


@pytest.fixture(scope="module", params=["native", "python"])
def ours(request):
    if request.param == "native":
        try:
            return TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=True)
        except ImportError:
            pytest.skip("rwkv._tokenizer is not built")
    return TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=False)


def test_vocabulary_tables_match(corpus, ours):
    _, up = corpus
    assert up["sizes"] == [len(ours.idx2token), len(ours.token2idx), min(ours.idx2token), max(ours.idx2token)]


def test_encode_matches_upstream(corpus, ours):
    payload, up = corpus
    got = [ours.encode(s) for s in payload["strings"]]
    mismatches = [(s, g, u) for s, g, u in zip(payload["strings"], got, up["encode"]) if g != u]
    assert not mismatches[:5]
    assert len(got) == len(up["encode"]) > 3000


def test_encode_bytes_matches_upstream(corpus, ours):
    payload, up = corpus
    got = [ours.encodeBytes(s2b(b)) for b in payload["bytes"]]
    assert got == up["encode_bytes"]
    got = [ours.decode(ours.encodeBytes(s2b(b))) for b in payload["bytes"]]
    assert got == up["decode_of_encoded_bytes"]


def test_decode_matches_upstream_including_failures(corpus, ours):
    payload, up = corpus
    assert [ours.decode(ids) for ids in payload["ids"]] == up["decode"]
    # a sanity check that the corpus exercises the failure rule at all
    assert sum(d == "\ufffd" for d in up["decode"]) > 20


def test_decode_bytes_matches_upstream_keyerror(corpus, ours):
    payload, up = corpus
    for ids, want in zip(payload["ids"], up["decode_bytes"]):
        try:
            got = b2s(ours.decodeBytes(ids))
        except KeyError as e:
            got = ["KeyError", repr(e.args[0])]
        assert got == want, ids


def test_print_tokens_matches_upstream(corpus, ours):
    payload, up = corpus
    for ids, want in zip(payload["print_ids"], up["print"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            ours.printTokens(ids)
        assert buf.getvalue() == want
