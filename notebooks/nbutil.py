"""Helpers shared by notebooks/execute_notebooks.py and tests/test_notebooks.py.

Standard library only, so that the checks of the committed notebooks need
neither Jupyter nor TensorFlow.
"""

import hashlib
import json
import os
import sys


def write_kernelspec(jupyter_dir, name):
    """Writes a kernelspec `name` for this Python under `jupyter_dir/kernels`.

    The kernel then runs the interpreter (and its venv) that runs the caller,
    not whatever the machine's default `python3` kernelspec points to.
    """
    spec_dir = os.path.join(jupyter_dir, "kernels", name)
    os.makedirs(spec_dir)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
        "metadata": {"debugger": False},
    }
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump(spec, f, indent=1)


def code_digest(nb):
    """The sha256 of a notebook's code cells (a dict or nbformat node)."""
    code = [cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            for cell in nb["cells"] if cell["cell_type"] == "code"]  # (a file has lists of lines)
    return hashlib.sha256(json.dumps(code).encode("utf-8")).hexdigest()
