"""World tokenizer unit tests: shipped vocabulary, safe parsing, strict decode, native/Python agreement."""

import hashlib
import os
import pickle
import random

import pytest

from rwkv import rwkv_tokenizer as rt
from rwkv.rwkv_tokenizer import TRIE, TRIE_TOKENIZER, WORLD_VOCAB_FILE, load_vocab

SHARED = "/work/shared/data"


def _native_or_skip(path):
    try:
        return TRIE_TOKENIZER(path, native=True)
    except ImportError:
        pytest.skip("rwkv._tokenizer is not built")


@pytest.fixture(scope="module")
def world():
    return TRIE_TOKENIZER(WORLD_VOCAB_FILE)


def test_shipped_vocab_sha256_matches_shared_sums():
    sums_file = os.path.join(SHARED, "SHA256SUMS")
    if not os.path.exists(sums_file):
        pytest.skip("shared data not present")
    sums = dict(reversed(line.split()) for line in open(sums_file) if line.strip())
    with open(WORLD_VOCAB_FILE, "rb") as f:
        data = f.read()
    assert b"\r\n" not in data
    assert hashlib.sha256(data).hexdigest() == sums["rwkv_vocab_v20230424.txt"]


def test_known_examples(world):
    assert world.encode("Hello world") == [33155, 40213]
    assert world.encode("\n\n") == [261]
    assert world.encode("User: hi\n\nAssistant:") == [24281, 59, 4571, 261, 5585, 41693, 59]
    assert world.encode("你好") == [10464, 11685]
    assert world.encode("") == []
    assert len(world.idx2token) == 65529 and min(world.idx2token) == 1 and max(world.idx2token) == 65529
    assert all(world.idx2token[b + 1] == bytes([b]) for b in range(256))


def test_decode_compat_rule_and_strict(world):
    assert world.decode([]) == ""
    assert world.decode([0]) == "\ufffd"
    assert world.decode([33, 0]) == "\ufffd"
    assert world.decode(world.encode("你")[:1] + [0]) == "\ufffd"
    with pytest.raises(ValueError, match=r"token id 0 at position 1 is not in the vocabulary"):
        world.decode_strict([33, 0])
    with pytest.raises(ValueError, match=r"token id 65530 "):
        world.decode_strict([65530])
    with pytest.raises(ValueError, match=r"token id 'x' "):
        world.decode_strict(["x"])
    with pytest.raises(ValueError, match="valid UTF-8"):
        world.decode_strict([0xE4 + 1])  # a lone lead byte of a 3-byte character
    assert world.decode_strict(world.encode("héllo 你好 😀")) == "héllo 你好 😀"


def test_decode_accepts_what_a_dict_lookup_accepts(world):
    np = pytest.importorskip("numpy")
    assert world.decode(np.array([33, 34])) == " !"
    assert world.decode((33, 34)) == " !"
    assert world.decode(iter([33, 34])) == " !"
    assert world.decode([True]) == "\x00"  # True == 1, as in upstream's dict lookup
    with pytest.raises(KeyError):
        world.decodeBytes([10**30])


def test_crlf_and_lf_files_parse_identically(tmp_path):
    lf = load_vocab(WORLD_VOCAB_FILE)
    crlf_path = tmp_path / "v.txt"
    with open(WORLD_VOCAB_FILE, "rb") as f:
        crlf_path.write_bytes(f.read().replace(b"\n", b"\r\n"))
    assert load_vocab(str(crlf_path)) == lf


@pytest.mark.parametrize("line,why", [
    ("1 'a'", "expected '<id> <literal> <length>'"),
    ("x 'a' 1", "id is not a non-negative integer"),
    ("1 'a' one", "length field"),
    ("1 'ab' 1", "has 2 bytes but the length field says 1"),
    ("1 __import__('os').getcwd() 1", "not a Python literal"),
    ("1 'a 1", "not a Python literal"),
    ("1 123 3", "is a int, expected str or bytes"),
    ("1 '\\ud800' 3", "not encodable as UTF-8"),
])
def test_malformed_lines_raise_with_line_number(tmp_path, line, why):
    path = tmp_path / "bad.txt"
    path.write_text("1 'a' 1\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.txt:3: malformed vocabulary line") as info:
        TRIE_TOKENIZER(str(path), native=False)
    assert why in str(info.value)


def test_no_eval_side_effects(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.txt"
    path.write_text(f"1 open({str(marker)!r}, 'w') 1\n", encoding="utf-8")
    with pytest.raises(ValueError):
        TRIE_TOKENIZER(str(path))
    assert not marker.exists()


def _encode_or_error(tok, data):
    try:
        return tok.encodeBytes(data)
    except ValueError as e:
        return str(e)


def _small_vocab(tmp_path):
    path = tmp_path / "small.txt"
    lines = ["1 'a' 1", "2 'ab' 2", "3 'abc' 3", "4 b'\\xff' 1", "5 ' ' 1", "6 'b' 1", "7 'bca' 3",
             "9 '你' 3", "10 'ab' 2"]  # id 10 re-uses 'ab': token2idx keeps the later id, as upstream
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_small_vocab_native_equals_python_and_missing_bytes_raise(tmp_path):
    path = _small_vocab(tmp_path)
    py = TRIE_TOKENIZER(path, native=False)
    nat = _native_or_skip(path)
    assert py.token2idx[b"ab"] == 10
    assert py.encode("abcab a") == nat.encode("abcab a") == [3, 10, 5, 1]
    assert nat.encode("bcab") == [7, 6]
    for tok in (py, nat):
        with pytest.raises(ValueError, match="no vocabulary token matches the bytes at position 1"):
            tok.encode("az")
    rng = random.Random(1)
    for _ in range(3000):
        data = bytes(rng.choice(b"abc \xff") for _ in range(rng.randint(0, 20)))
        assert _encode_or_error(py, data) == _encode_or_error(nat, data)  # a lone 'c' has no token
        ids = [rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0]) for _ in range(rng.randint(0, 5))]
        for fn in ("decode", "decodeBytes"):
            try:
                want = getattr(py, fn)(ids)
            except KeyError as e:
                want = ("KeyError", e.args)
            try:
                got = getattr(nat, fn)(ids)
            except KeyError as e:
                got = ("KeyError", e.args)
            assert got == want


def test_random_bytes_native_equals_python(world):
    if not world.native:
        pytest.skip("rwkv._tokenizer is not built")
    py = TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=False)
    rng = random.Random(7)
    for _ in range(2000):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        assert world.encodeBytes(data) == py.encodeBytes(data)
        assert world.encodeBytes(bytearray(data)) == world.encodeBytes(memoryview(data))
    with pytest.raises(TypeError):
        world.encodeBytes("not bytes")


def test_native_decode_bounds(world):
    if not world.native:
        pytest.skip("rwkv._tokenizer is not built")
    for bad in (-1, -(2**70), 2**24, 2**63, 2**64 + 33, 65530):
        with pytest.raises(KeyError):
            world.decodeBytes([33, bad])
        assert world.decode([bad]) == "\ufffd"


def test_pickle_round_trip_and_lazy_root(world):
    clone = pickle.loads(pickle.dumps(world))
    assert clone.native == world.native
    assert clone.encode("round trip 你好") == world.encode("round trip 你好")
    root = world.root
    assert isinstance(root, TRIE) and world.root is root
    end, node, values = root.find_longest(b"Hello world", 0)
    assert end == 5 and values == {(b"Hello", 33155)}


def test_trie_api():
    root = TRIE()
    node = root.add(b"ab", val=("ab", 1))
    root.add(b"abcd")
    assert node.ch == ord("b") and node.front.ch == ord("a") and node.front.front is root
    assert root.find_longest(b"abcx", 0)[0] == 2
    assert root.find_longest(b"xxabcd", 2) == (6, root.to[97].to[98].to[99].to[100], {b"abcd"})
    assert "TRIE [97, 98]" in repr(node)
    with pytest.raises(ValueError):
        root.find_longest(b"zz", 0)


def test_native_required_but_missing(monkeypatch):
    monkeypatch.setattr(rt, "_native_module", lambda: None)
    with pytest.raises(ImportError, match="rwkv._tokenizer"):
        TRIE_TOKENIZER(WORLD_VOCAB_FILE, native=True)
    assert not TRIE_TOKENIZER(WORLD_VOCAB_FILE).native


def test_odd_inputs_never_crash(world):
    assert world.decode([None]) == world.decode([[1]]) == world.decode("abc") == "\ufffd"
    with pytest.raises(TypeError):
        world.decodeBytes([[1]])
    with pytest.raises(KeyError):
        world.decodeBytes([None])
    with pytest.raises(AttributeError):  # as upstream: None has no .encode
        world.encode(None)
    if not world.native:
        return
    native_type = type(world._native)
    blank = native_type.__new__(native_type)
    with pytest.raises(RuntimeError, match="not initialised"):
        blank.encode(b"x")
    with pytest.raises(RuntimeError, match="already initialised"):
        world._native.__init__([], [])
    with pytest.raises(TypeError):
        native_type([(1, b"a")], [])
    with pytest.raises(TypeError):
        native_type([(b"a", 1)], [(b"a", 1)])
    with pytest.raises(ValueError):
        native_type([(b"a", -1)], [])
    with pytest.raises(TypeError):
        world._native.decode(iter([1]))
    assert native_type([], []).encode(b"") == []
    with pytest.raises(ValueError, match="position 0"):
        native_type([], []).encode(b"a")


def test_random_vocabularies_native_equals_python(tmp_path):
    rng = random.Random(11)
    for round_ in range(5):
        tokens = {bytes(rng.choice(b"abcd\x00\xff") for _ in range(rng.randint(1, 6))) for _ in range(150)}
        lines = [f"{i + 1} {t!r} {len(t)}" for i, t in enumerate(sorted(tokens))]
        path = tmp_path / f"v{round_}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        py, nat = TRIE_TOKENIZER(str(path), native=False), _native_or_skip(str(path))
        for _ in range(500):
            data = bytes(rng.choice(b"abcde\x00\xff") for _ in range(rng.randint(0, 30)))
            assert _encode_or_error(py, data) == _encode_or_error(nat, data), data
