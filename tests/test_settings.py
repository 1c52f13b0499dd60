"""rwkv.settings: every environment variable the package reads is registered, read there only,
parsed the same way everywhere, and listed in the README's tables as the registry says."""

import ast
import re
import warnings
from pathlib import Path

import pytest

from rwkv import settings

REPO = Path(__file__).resolve().parents[1]


def _python_files(folder):
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _env_reads(tree):
    """(line, name or None) of every environment read in a module: os.environ.get / os.getenv /
    os.environ[...] / ``... in os.environ`` / environ.get; name is the literal variable name."""
    found = []

    def is_environ(node):
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
               (isinstance(node, ast.Name) and node.id == "environ")

    def literal(node):
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr in ("get", "pop", "setdefault") and is_environ(f.value)) or \
                    (f.attr in ("getenv", "getenvb") and isinstance(f.value, ast.Name) and f.value.id == "os"):
                found.append((node.lineno, literal(node.args[0]) if node.args else None))
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            found.append((node.lineno, literal(node.slice)))
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            found.append((node.lineno, literal(node.left)))
    return found


def test_the_package_reads_the_environment_only_through_the_registry():
    outside = []
    for path in _python_files("rwkv"):
        rel = path.relative_to(REPO).as_posix()
        for line, name in _env_reads(ast.parse(path.read_text(), rel)):
            if rel != "rwkv/settings.py":
                outside.append(f"{rel}:{line}: reads {name or 'a variable'} directly")
    assert not outside, "read settings through rwkv.settings.value():\n" + "\n".join(outside)


def test_every_rwkv_variable_named_in_the_package_is_registered():
    # A variable name in a string (a read, a message, a docstring) must be a registered setting,
    # so no read can hide behind a name built elsewhere.
    unknown = []
    for path in _python_files("rwkv"):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in re.findall(r"\bRWKV_[A-Z0-9_]+\b", node.value):
                    if not settings.registered(name):
                        unknown.append(f"{rel}:{node.lineno}: {name}")
    assert not unknown, "unregistered RWKV_* variables (add them to rwkv/settings.py):\n" + "\n".join(unknown)


def test_the_extension_reads_no_environment():
    reads = []
    for path in sorted((REPO / "csrc").rglob("*")):
        if path.suffix in (".h", ".cpp", ".cu", ".cuh"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\b(secure_)?getenv\s*\(", line):
                    reads.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not reads, ("C++ gets run-time settings passed in from Python (rwkv/settings.py), "
                       "not from getenv:\n" + "\n".join(reads))


def test_setup_reads_exactly_the_build_settings():
    names = {name for _, name in _env_reads(ast.parse((REPO / "setup.py").read_text()))}
    assert None not in names, "setup.py reads a variable whose name is not a literal"
    registered = {s.name for s in settings.BUILD_SETTINGS}
    assert names <= registered, f"unregistered build settings: {sorted(names - registered)}"
    # MAX_JOBS is read by torch.utils.cpp_extension, which setup.py builds with.
    assert registered - names == {"MAX_JOBS"}


def _readme_table(marker):
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- {marker}: begin[^>]*-->\n(.*?)\n<!-- {marker}: end -->", text, re.DOTALL)
    assert m, f"README.md has no '<!-- {marker}: begin -->' ... '<!-- {marker}: end -->' block"
    return m.group(1).strip()


def test_the_readme_tables_are_the_registry():
    hint = " (paste rwkv.settings.markdown_table({}) there)"
    assert _readme_table("settings") == settings.markdown_table(), hint.format("")
    assert _readme_table("build settings") == settings.markdown_table(build=True), hint.format("build=True")


@pytest.mark.parametrize("name, raw, expected", [
    ("RWKV_CPU_PLAN", None, True), ("RWKV_CPU_PLAN", "", True), ("RWKV_CPU_PLAN", "0", False),
    ("RWKV_CPU_PLAN", " off ", False), ("RWKV_EXACT_INT8", "1", True), ("RWKV_EXACT_INT8", "yes", True),
    ("RWKV_EXACT_INT8", "0", False), ("RWKV_RESCALE_LAYER", "6", 6), ("RWKV_RESCALE_LAYER", None, None),
    ("RWKV_KERNELS", "Reference", "reference"), ("RWKV_KERNELS", "", "auto"),
    ("RWKV_CPU_READ_ORDER", "pairs", "streams"), ("RWKV_CPU_ISA", "avx2", "avx2"),
    ("RWKV_CPU_ISA", None, None), ("RWKV_JIT_ON", "1", "1"), ("RWKV_DE_VERSION", None, None),
])
def test_values_parse(name, raw, expected, monkeypatch):
    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert settings.value(name) == expected


@pytest.mark.parametrize("name, raw, expected, message", [
    ("RWKV_CPU_PLAN", "maybe", True, "RWKV_CPU_PLAN must be 0 or 1, got 'maybe'; using 1"),
    ("RWKV_RESCALE_LAYER", "six", None, "RWKV_RESCALE_LAYER must be an integer, got 'six'"),
    ("RWKV_KERNELS", "fast", "auto", "RWKV_KERNELS must be auto, compiled or reference, got 'fast'; using 'auto'"),
    ("RWKV_CPU_ISA", "sse9", None, ("RWKV_CPU_ISA must be scalar, avx2, avx512, avx512vnni or avx512bf16, "
                                    "got 'sse9'; ignoring it")),
])
def test_invalid_values_warn_and_give_the_default(name, raw, expected, message, monkeypatch):
    monkeypatch.setenv(name, raw)
    monkeypatch.setattr(settings, "_warned", set())
    with pytest.warns(RuntimeWarning, match=re.escape(message)):
        assert settings.value(name) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per variable and value
        assert settings.value(name) == expected


def test_unknown_names_are_refused():
    with pytest.raises(KeyError, match="'RWKV_TURBO' is not a registered setting"):
        settings.value("RWKV_TURBO")


def test_keywords_name_real_arguments():
    import inspect

    from rwkv.model import RWKV
    params = inspect.signature(RWKV.__init__).parameters
    for s in settings.SETTINGS:
        if s.keyword is not None:
            assert s.keyword in params and params[s.keyword].kind is inspect.Parameter.KEYWORD_ONLY, s.name
