"""The documentation stays true: its generated pages match the code, the
site builds with `mkdocs build --strict` (a broken link or a missing page
fails), the environment-variable table covers every `KERASDIST_*` setting the
code reads, and every fenced Python block of the README and the docs runs.

A block runs as its own script at one process, or under `kerasdist-run -np
2` when the line before it is `<!-- kd: np=2 -->`. `<!-- kd: skip (reason)
-->` skips a block and must say why.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import HERE

ROOT = os.path.dirname(HERE)
DOCS = os.path.join(ROOT, "docs")
BIN = os.path.dirname(sys.executable)
MARKER = re.compile(r"<!-- kd: (np=2|skip \((.+)\)) -->\s*$")


def _markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    for folder, _, names in os.walk(DOCS):
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
    return files


def _blocks():
    """(id, code, marker) of every ```python block."""
    found = []
    for path in _markdown_files():
        lines = open(path).read().split("\n")
        rel = os.path.relpath(path, ROOT)
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```python":
                start = i
                end = lines.index("```", i + 1)
                marker = MARKER.match(lines[start - 1].strip()) if start else None
                found.append((f"{rel}:{start + 1}", "\n".join(lines[start + 1:end]), marker))
                i = end
            i += 1
    return found


BLOCKS = _blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_python_block_runs(block, tmp_path):
    where, code, marker = block
    if marker is not None and marker.group(2):
        pytest.skip(marker.group(2))
    script = tmp_path / "block.py"
    script.write_text(code + "\n")
    cmd = [sys.executable, str(script)]
    if marker is not None and marker.group(1) == "np=2":
        cmd = [os.path.join(BIN, "kerasdist-run"), "-np", "2"] + cmd
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=ROOT)
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400,
                          env=env)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_the_generated_pages_match_the_code():
    proc = subprocess.run([sys.executable, os.path.join(DOCS, "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_site_builds_strictly(tmp_path):
    proc = subprocess.run([os.path.join(BIN, "mkdocs"), "build", "--strict", "-q",
                           "-f", os.path.join(ROOT, "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()


def _names_read_by_the_code():
    names = set()
    pattern = re.compile(r"[\"'](KERASDIST_[A-Z0-9_]+)[\"']")
    for top in ("kerasdist", "callbacks"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py") and name != "env_vars.py":
                    names.update(pattern.findall(open(os.path.join(folder, name)).read()))
    return names


def test_the_configuration_table_covers_every_setting():
    from kerasdist.common.env_vars import ENV_VARS

    table = {name for name, _, _ in ENV_VARS}
    read = _names_read_by_the_code()
    assert sorted(read - table) == [], "read by the code but not in env_vars.ENV_VARS"
    assert sorted(table - read) == [], "in env_vars.ENV_VARS but read nowhere"


def test_the_readme_is_a_short_guide():
    text = open(os.path.join(ROOT, "README.md")).read()
    assert text.count("\n") <= 250
    for leak in ("../shared", "no internet", "issue "):
        assert leak not in text, leak


def test_docstring_examples_run_or_are_marked():
    proc = subprocess.run([sys.executable, os.path.join(HERE, "docstring_examples.py")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, PYTHONWARNINGS="ignore",
                                   TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.count("\nran ") + proc.stdout.startswith("ran ") >= 10, proc.stdout
