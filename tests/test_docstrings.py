"""Every public class, function and method of the user-facing modules has a docstring of its own,
so ``help()`` shows what it does (an inherited one, such as torch.nn.Module's, does not count)."""

import importlib
import inspect

import pytest

MODULES = ["rwkv.model", "rwkv.utils", "rwkv.generation", "rwkv.prefix_cache", "rwkv.state_io",
           "rwkv.rwkv_tokenizer", "rwkv.sampling", "rwkv.strategy", "rwkv.settings", "rwkv.cli.chat",
           "rwkv.cli.common", "rwkv.__main__"]
# Members whose documentation is the class's or the language's.
SKIP = {"__init__"}


def _public(module):
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    for name in names:
        obj = getattr(module, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ == module.__name__:
            yield name, obj


def _own_doc(obj):
    doc = obj.__doc__ if not isinstance(obj, property) else obj.fget.__doc__
    return (doc or "").strip()


@pytest.mark.parametrize("module_name", MODULES)
def test_public_names_have_docstrings(module_name):
    module = importlib.import_module(module_name)
    assert _own_doc(module), f"{module_name} has no module docstring"
    missing = []
    for name, obj in _public(module):
        if not _own_doc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or attr in SKIP:
                    continue
                if (inspect.isfunction(member) or isinstance(member, property)) and not _own_doc(member):
                    missing.append(f"{name}.{attr}")
    assert not missing, f"{module_name}: no docstring: {', '.join(missing)}"


def test_the_model_constructor_documents_itself():
    from rwkv.model import RWKV
    assert "strategy" in _own_doc(RWKV.__init__) and "forward" in _own_doc(RWKV)
