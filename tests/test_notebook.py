"""examples/quickstart.ipynb runs top to bottom on a kernel of this interpreter (nbclient), and is
stored without outputs."""

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="make setup installs nbformat, nbclient and ipykernel")
nbclient = pytest.importorskip("nbclient", reason="make setup installs nbformat, nbclient and ipykernel")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


def _read():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_the_notebook_is_stored_without_outputs():
    for i, cell in enumerate(_read().cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"cell {i} of {NOTEBOOK.name} has outputs: strip them before committing "
                "(jupyter nbconvert --clear-output --inplace)")


@pytest.mark.skipif(not (REPO / "models" / "rwkv7-tiny" / "rwkv7-tiny.pth").exists(),
                    reason="the shipped model is not in this checkout")
def test_the_notebook_runs_top_to_bottom(tmp_path):
    pytest.importorskip("ipykernel", reason="make setup installs ipykernel")
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    nb = _read()
    # The kernel is this interpreter (a kernel spec of our own, so no kernel installed elsewhere
    # under the same name is picked up), with this checkout first on its path.
    spec = tmp_path / "kernels" / "rwkv-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rwkv test", "language": "python"}))
    km = KernelManager(kernel_name="rwkv-test",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    client = nbclient.NotebookClient(nb, km=km, timeout=120,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute(env=env)  # raises CellExecutionError naming the failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "stopped by" in text and "from the cache" in text
