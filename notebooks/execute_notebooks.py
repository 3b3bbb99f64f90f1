"""Executes the notebooks at their full settings and saves them with outputs.

The notebooks are committed executed, so that a reader sees their output and
plots without running anything. After editing a notebook, run (from the
repository root, in the environment where kerasdist is installed):

    python notebooks/execute_notebooks.py               # all of them
    python notebooks/execute_notebooks.py mnist_timeline.ipynb

Each notebook runs top to bottom in a fresh kernel of this Python (through
nbclient, with a temporary kernelspec, as tests/test_notebooks.py does), with
the default amount of work: `KERASDIST_NOTEBOOK_*` variables set in the
environment are removed first. A cell that raises stops the script and the
notebook is not written. The saved notebook keeps the generic `python3`
kernelspec, not the temporary one.

tests/test_notebooks.py executes the notebooks again from scratch (with
little work, ignoring these outputs) and checks that the committed ones
carry outputs and plots and no error.
"""

import argparse
import os
import re
import sys
import tempfile
import time

import nbclient
import nbformat

from nbutil import code_digest, write_kernelspec

NOTEBOOKS_DIR = os.path.dirname(os.path.abspath(__file__))
KERNEL_NAME = "kerasdist-notebook-python"
CELL_TIMEOUT = 900  # seconds, per cell
# TensorFlow's start-up lines (printed before absl logging is initialized,
# so TF_CPP_MIN_LOG_LEVEL does not silence them), alone or relayed by kd.run
# with a "[rank] " prefix: noise, with timestamps and thread ids.
NOISE = re.compile(r"^(\[\d+\] )?(WARNING: All log messages before absl::InitializeLog"
                   r"|I0000 .* oneDNN custom operations are on)")
# Temporary directories made by the notebooks (their random suffix).
TEMP_DIR = re.compile(re.escape(tempfile.gettempdir()) + r"/(kerasdist-[a-z]+-)\w+")
KERNELSPEC = {  # what the committed notebooks say, whoever executed them
    "display_name": "Python 3 (ipykernel)",
    "language": "python",
    "name": "python3",
}


def clean_outputs(cell):
    """Drops noise from the cell's stream outputs and merges consecutive ones."""
    outputs = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            lines = [line for line in out.text.splitlines(keepends=True)
                     if not NOISE.match(line)]
            out.text = TEMP_DIR.sub(r"$TMPDIR/\1XXXXXXXX", "".join(lines))
            if not out.text:
                continue
            if outputs and outputs[-1].output_type == "stream" and outputs[-1].name == out.name:
                outputs[-1].text += out.text
                continue
        outputs.append(out)
    cell.outputs = outputs


def execute(path):
    with open(path, encoding="utf-8") as f:
        nb = nbformat.read(f, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL_NAME,
        interrupt_on_timeout=True,
        resources={"metadata": {"path": NOTEBOOKS_DIR}})
    client.execute()  # Raises CellExecutionError if a cell fails.
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    # tests/test_notebooks.py checks that the outputs are those of this code.
    nb.metadata["kerasdist"] = {"executed_code_sha256": code_digest(nb)}
    # Keep the Python version, drop the rest (codemirror mode, lexer, ...).
    info = nb.metadata.get("language_info", {})
    nb.metadata["language_info"] = {k: info[k] for k in ("name", "version") if k in info}
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)  # run times: noise in a diff
        if cell.cell_type == "code":
            clean_outputs(cell)
    nbformat.validate(nb)
    with open(path, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*",
                        help="notebook file names in notebooks/ (default: all)")
    names = parser.parse_args().notebooks or sorted(
        n for n in os.listdir(NOTEBOOKS_DIR) if n.endswith(".ipynb"))
    for var in [v for v in os.environ if v.startswith("KERASDIST_NOTEBOOK_")]:
        del os.environ[var]  # the full settings
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    with tempfile.TemporaryDirectory(prefix="kerasdist-notebooks-") as tmp:
        write_kernelspec(os.path.join(tmp, "jupyter"), KERNEL_NAME)
        os.environ["JUPYTER_PATH"] = os.path.join(tmp, "jupyter")  # our kernelspec only
        os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(tmp, "runtime")
        os.environ["IPYTHONDIR"] = os.path.join(tmp, "ipython")
        for name in names:
            path = os.path.join(NOTEBOOKS_DIR, os.path.basename(name))
            start = time.monotonic()
            print(f"executing {path} ...", flush=True)
            execute(path)
            print(f"  saved in {time.monotonic() - start:.0f} s, "
                  f"{os.path.getsize(path) / 1024:.0f} KiB", flush=True)


if __name__ == "__main__":
    main()
