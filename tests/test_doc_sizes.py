"""The documents stay short enough to read: the README for a user, RESULTS.md for the current
results only (older runs live in git history), docs/kernels.md for the design without timings."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path, max_lines", [
    ("README.md", 300), ("benchmarks/RESULTS.md", 400), ("docs/kernels.md", 1500),
])
def test_document_length(path, max_lines):
    n = len((REPO / path).read_text().splitlines())
    assert n <= max_lines, f"{path} has {n} lines, more than {max_lines}"


def test_the_readme_speed_section_is_short():
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Speed\b.*?(?=^## )", text, re.DOTALL | re.MULTILINE)
    assert m, "README.md has no '## Speed' section followed by another section"
    words = len(m.group(0).split())
    assert words <= 250, f"README.md's Speed section has {words} words, more than 250 (details go to RESULTS.md)"
