"""The product speaks of itself only: no words of how its development was organised.

Docs, comments, code, tests and benchmarks say what the software does and why. Words that name when
or under which work item something was done (an ordinal "session", an issue number, scripts kept in
a scratch folder) belong to the version history, not to the files. This test reads every file git
tracks (and new files not yet added, unless ignored) and fails on such words, naming file and line.
"""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_SIMPLE = (_UNITS + "|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth"
           "|eighteenth|nineteenth|twentieth|thirtieth|fortieth|fiftieth|sixtieth")
_TENS = "twenty|thirty|forty|fifty|sixty"
# An ordinal: "forty-first", "twelfth", "41st".
_ORD = rf"(?:(?:{_TENS})-(?:{_UNITS})|{_SIMPLE}|\d+(?:st|nd|rd|th))"

PATTERNS = {
    # one or more ordinals (a range or a list) before the word for a work period
    "an ordinal naming a session": rf"\b{_ORD}(?:\s*(?:to|and|or|,|-|–)\s*(?:the\s+)?{_ORD})*\s+sessions?\b",
    # that word with a number after it, or with a word placing it in time
    "a session named by number or time": (r"\bsessions?\s+#?\d+\b|\b(?:earlier|previous|prior|later|recent)\s+sessions?\b"
                                          r"|\blast\s+\w+\s+sessions\b|\bthis\s+session's\b"),
    # a work item's number, with or without "#"
    "an issue number": r"\bissues?\s+#?\d+",
    # scripts kept in a scratch folder per work period
    "a scratch script": r"/tmp/s\d+/",
}
# The words the examples below are built from, kept apart so that this file passes its own check.
S, I = "ses" + "sion", "is" + "sue"
_REGEX = re.compile("|".join(f"(?P<p{i}>{p})" for i, p in enumerate(PATTERNS.values())), re.IGNORECASE)
_NAMES = list(PATTERNS)

# Data, not prose: vocabularies, trained weights, the shipped model's training log.
SKIP_SUFFIXES = {".pth", ".safetensors", ".bin", ".json", ".png", ".jpg", ".npz", ".pt"}
SKIP_FILES = {"rwkv/rwkv_vocab_v20230424.txt", "models/rwkv7-tiny/train_log.txt"}


def _tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in out.decode().split("\0") if p]


def find_process_words(text: str):
    """[(line number, what kind, matched text)] for every development-process reference in ``text``."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in _REGEX.finditer(line):
            kind = _NAMES[int(m.lastgroup[1:])]
            hits.append((n, kind, m.group(0)))
    return hits


@pytest.mark.parametrize("text, kind", [
    (f"measured in the forty-first {S}", "an ordinal naming a session"),
    (f"the thirty-eighth to fortieth {S}s", "an ordinal naming a session"),
    (f"as in the 38th {S}", "an ordinal naming a session"),
    (f"twenty-sixth and thirty-seventh {S}s", "an ordinal naming a session"),
    (f"see {S} 41", "a session named by number or time"),
    (f"the machine of earlier {S}s", "a session named by number or time"),
    (f"over the last twelve {S}s", "a session named by number or time"),
    (f"checked against {I} 3's targets", "an issue number"),
    (f"fixes {I.capitalize()} #12", "an issue number"),
    ("scripts in /tmp/" + "s41/inter.py", "a scratch script"),
])
def test_the_patterns_catch_process_words(text, kind):
    assert [h[1] for h in find_process_words(text)] == [kind]


@pytest.mark.parametrize("text", [
    "ChatSession keeps the session's history",
    "the same seed, the same session: the same tokens",
    "the first token is fed twice",
    "a decode session of 50 tokens",
    "https://github.com/pytorch/pytorch/issues/12345",
])
def test_the_patterns_leave_ordinary_words(text):
    assert find_process_words(text) == []


def test_no_process_words_in_tracked_files():
    files = _tracked_files()
    if files is None:
        pytest.skip("not a git checkout: no list of tracked files")
    found = []
    for rel in files:
        path = REPO / rel
        if rel in SKIP_FILES or path.suffix in SKIP_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{rel}:{n}: {kind}: {match!r}" for n, kind, match in find_process_words(text)]
    assert not found, ("development-process words in the product (say what the software does and why; "
                       "history belongs to git):\n" + "\n".join(found[:200]) +
                       (f"\n... and {len(found) - 200} more" if len(found) > 200 else ""))
