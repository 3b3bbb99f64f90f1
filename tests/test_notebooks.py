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

The notebooks are committed executed, with their outputs and plots (saved
by `python notebooks/execute_notebooks.py`, at their full settings), so that
a reader sees them without running anything. The run here ignores those
outputs (it clears them first), and `test_committed_outputs` checks the
committed files: every code cell executed, in order, in one run; at least
one PNG plot; no error output; no machine-specific paths; no megabytes of
logs; and the code is the code that was executed (its digest, recorded by
the script). A plot cell must also plot in the fresh run.

Running requires `nbclient`, `nbformat`, `ipykernel` and `matplotlib`
(skipped otherwise); the checks of the committed files need none of them.
"""

import importlib.util
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(HERE)
NOTEBOOKS_DIR = os.path.join(REPO_DIR, "notebooks")
NOTEBOOKS = sorted(name for name in os.listdir(NOTEBOOKS_DIR)
                   if name.endswith(".ipynb")) if os.path.isdir(NOTEBOOKS_DIR) else []
KERNEL_NAME = "kerasdist-test-python"
CELL_TIMEOUT = 600  # seconds, per cell
MAX_NOTEBOOK_BYTES = 1024 * 1024  # a committed notebook, plots included
MAX_STREAM_CHARS = 20_000  # one cell's printed text (no progress-bar spam)


def _nbutil():
    spec = importlib.util.spec_from_file_location("nbutil", os.path.join(NOTEBOOKS_DIR, "nbutil.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


nbutil = _nbutil()
code_digest = nbutil.code_digest


def test_notebooks_found():
    assert {"mnist_quickstart.ipynb", "mnist_timeline.ipynb"} <= set(NOTEBOOKS)


def png_cells(cells):
    """Indices of the code cells with a PNG output."""
    return [i for i, cell in enumerate(cells) if cell["cell_type"] == "code"
            and any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_outputs(name):
    """The committed notebook carries the outputs of one full, clean run."""
    path = os.path.join(NOTEBOOKS_DIR, name)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    nb = json.loads(text)
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    redo = "; run `python notebooks/execute_notebooks.py` and commit the result"
    # Every code cell executed, top to bottom, in one kernel.
    counts = [cell.get("execution_count") for cell in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{name}: execution counts {counts}, not 1 to {len(code)}: the notebook "
        f"is not committed executed in one run{redo}")
    executed = nb["metadata"].get("kerasdist", {}).get("executed_code_sha256")
    assert executed == code_digest(nb), (
        f"{name}: its code is not the code its outputs come from{redo}")
    outputs = [out for cell in code for out in cell.get("outputs", [])]
    assert outputs, f"{name} is committed without outputs{redo}"
    assert png_cells(nb["cells"]), f"{name} is committed without a plot{redo}"
    errors = [f"{out.get('ename')}: {out.get('evalue')}" for out in outputs
              if out["output_type"] == "error"]
    assert not errors, f"{name} is committed with errors: {errors}"
    tracebacks = [out for out in outputs if out["output_type"] == "stream"
                  and "Traceback (most recent call last)" in "".join(out["text"])]
    assert not tracebacks, f"{name} is committed with a traceback in its output"
    # No logs from a long run, nothing from the machine it ran on.
    assert len(text.encode("utf-8")) <= MAX_NOTEBOOK_BYTES, (
        f"{name} is {len(text) / 1024:.0f} KiB")
    for i, cell in enumerate(code):
        printed = sum(len("".join(out["text"])) for out in cell.get("outputs", [])
                      if out["output_type"] == "stream")
        assert printed <= MAX_STREAM_CHARS, (
            f"{name}: code cell {i + 1} prints {printed} characters")
    assert nb["metadata"]["kernelspec"]["name"] == "python3", nb["metadata"]["kernelspec"]
    assert REPO_DIR not in text, f"{name} holds the path {REPO_DIR}"
    if sys.prefix != sys.base_prefix:  # a virtual environment's path, e.g. .venv
        assert sys.prefix not in text, f"{name} holds the path {sys.prefix}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    jupyter_dir = str(tmp_path / "jupyter")
    nbutil.write_kernelspec(jupyter_dir, KERNEL_NAME)
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
    committed_plots = png_cells(nb.cells)
    for cell in nb.cells:  # From scratch: nothing of the committed run is kept.
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
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
    # The cells that plot in the committed notebook plot here too (a stale
    # committed notebook, or a plot lost on the way, fails).
    assert png_cells(nb.cells) == committed_plots, (
        f"{name}: code cells {png_cells(nb.cells)} plot in this run, "
        f"{committed_plots} in the committed notebook")
