"""Executes every notebook in notebooks/ top to bottom, with little work.

Each notebook runs in a fresh Jupyter kernel, through nbclient, with
`KERASDIST_NOTEBOOK_STEPS=10` and `KERASDIST_NOTEBOOK_EPOCHS=1`; a cell that
raises fails the test (nbclient raises `CellExecutionError`, which quotes
the cell and its traceback).

The kernel must be this Python (the one running pytest, with kerasdist and
its `mpiexec`), not whatever the machine's default `python3` kernelspec
points to. So the test writes its own kernelspec, whose command is
`sys.executable -m ipykernel_launcher`, into a temporary directory put first
on `JUPYTER_PATH`: nothing is installed into the environment or the home
directory, and a stale or foreign kernelspec cannot be picked up.

Requires `nbclient`, `nbformat`, `ipykernel` and `matplotlib` (skipped
otherwise).
"""

import json
import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS_DIR = os.path.join(os.path.dirname(HERE), "notebooks")
NOTEBOOKS = sorted(name for name in os.listdir(NOTEBOOKS_DIR)
                   if name.endswith(".ipynb")) if os.path.isdir(NOTEBOOKS_DIR) else []
KERNEL_NAME = "kerasdist-test-python"
CELL_TIMEOUT = 600  # seconds, per cell


def write_kernelspec(jupyter_dir):
    """Writes a kernelspec for this Python under `jupyter_dir/kernels`."""
    spec_dir = os.path.join(jupyter_dir, "kernels", KERNEL_NAME)
    os.makedirs(spec_dir)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
        "metadata": {"debugger": False},
    }
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump(spec, f, indent=1)


def test_notebooks_found():
    assert {"mnist_quickstart.ipynb", "mnist_timeline.ipynb"} <= set(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, monkeypatch):
    jupyter_dir = str(tmp_path / "jupyter")
    write_kernelspec(jupyter_dir)
    # The kernel inherits this environment.
    monkeypatch.setenv("JUPYTER_PATH", jupyter_dir)  # our kernelspec only
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("KERASDIST_NOTEBOOK_STEPS", "10")
    monkeypatch.setenv("KERASDIST_NOTEBOOK_EPOCHS", "1")
    monkeypatch.setenv("KERASDIST_NOTEBOOK_OUTPUT_DIR", str(tmp_path / "output"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")

    with open(os.path.join(NOTEBOOKS_DIR, name), encoding="utf-8") as f:
        nb = nbformat.read(f, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL_NAME,
        # On a timeout, interrupt the cell (KeyboardInterrupt): kd.run then
        # stops its ranks before the kernel is shut down.
        interrupt_on_timeout=True,
        resources={"metadata": {"path": NOTEBOOKS_DIR}})
    client.execute()  # Raises CellExecutionError if a cell fails.

    # The run used this Python, and produced something in every code cell
    # that is meant to print or plot.
    outputs = [out for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.output_type == "error"]
    assert any(out.output_type == "display_data" and "image/png" in out.data
               for out in outputs), f"{name} shows no plot"
