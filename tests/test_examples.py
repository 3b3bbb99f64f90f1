"""Smoke tests of the MNIST examples and their data loader.

The loader tests run in this process (numpy only). The example tests run
each script on 2 ranks under the environment's own launcher, for a few steps
only, with a hard timeout that kills the whole process group: a hang fails
the test instead of blocking the suite. No download and no
`KERASDIST_DATA_DIR` are needed: the examples find the repository's copy of
MNIST in `examples/data/mnist`.
"""

import gzip
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
DATA_DIR = os.path.join(EXAMPLES, "data", "mnist")
BIN_DIR = os.path.dirname(sys.executable)

sys.path.insert(0, EXAMPLES)
import mnist_data  # noqa: E402

LABEL_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
ACCURACY_LINE = re.compile(r"^(?:\[\d+\] )?test accuracy: (\d\.\d{4})$", re.MULTILINE)
# Few steps: these check the plumbing, not the accuracy of a full run.
QUICK = ["--epochs", "1", "--steps-per-epoch", "20"]


def launcher(np_, tool="mpiexec"):
    """The command prefix that starts `np_` ranks of this Python."""
    path = os.path.join(BIN_DIR, tool)
    if tool == "kerasdist-run" and not os.path.exists(path):
        tool, path = "mpiexec", os.path.join(BIN_DIR, "mpiexec")
    if not os.path.exists(path):
        path = shutil.which(tool) or tool
    flag = "-np" if tool == "kerasdist-run" else "-n"
    return [path, flag, str(np_)]


def run_example(script, args=(), np_=2, tool="mpiexec", timeout=150, check=True):
    """Runs examples/<script> on `np_` ranks; returns (returncode, output)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("KERASDIST_DATA_DIR", None)  # the repository copy must be found
    cmd = launcher(np_, tool) + [sys.executable, os.path.join(EXAMPLES, script),
                                 *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=HERE, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{script} on {np_} ranks timed out after {timeout} s. "
                    f"Output:\n{out[-6000:]}")
    if check and proc.returncode != 0:
        pytest.fail(f"{script} on {np_} ranks exited with {proc.returncode}. "
                    f"Output:\n{out[-8000:]}")
    return proc.returncode, out


def printed_accuracy(out):
    """Returns the value of the single `test accuracy:` line of `out`."""
    found = ACCURACY_LINE.findall(out)
    assert len(found) == 1, f"expected one `test accuracy:` line (printed by " \
                            f"rank 0 only), got {found}. Output:\n{out[-4000:]}"
    return float(found[0])


# The loader.


@pytest.fixture(scope="module")
def mnist():
    return mnist_data.load_mnist()


def test_loader_finds_the_repository_copy(monkeypatch):
    monkeypatch.delenv("KERASDIST_DATA_DIR", raising=False)
    assert os.path.samefile(mnist_data.resolve_data_dir(), DATA_DIR)


def test_loader_shapes_dtypes_and_known_statistics(mnist):
    (x_train, y_train), (x_test, y_test) = mnist
    assert x_train.shape == (60000, 28, 28) and y_train.shape == (60000,)
    assert x_test.shape == (10000, 28, 28) and y_test.shape == (10000,)
    for array in (x_train, y_train, x_test, y_test):
        assert array.dtype == np.uint8
    assert np.bincount(y_train, minlength=10).tolist() == LABEL_COUNTS
    assert y_test.min() == 0 and y_test.max() == 9
    assert abs(x_train.mean(dtype=np.float64) / 255.0 - 0.1307) < 5e-4
    assert abs(x_train.std(dtype=np.float64) / 255.0 - 0.3081) < 5e-4


def _write_idx(path, magic, dims, payload):
    header = np.array([magic, *dims], dtype=">u4").tobytes()
    with gzip.open(path, "wb") as f:
        f.write(header + payload)


def test_loader_rejects_a_corrupt_header(tmp_path):
    for name, (magic, shape, _) in mnist_data.FILES.items():
        _write_idx(tmp_path / f"{name}.gz", magic, (2,) + shape[1:],
                   bytes(2 * int(np.prod(shape[1:]))))
    # A wrong magic number: not an IDX file of unsigned bytes.
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", 0x12345678, (2, 28, 28),
               bytes(2 * 28 * 28))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz is not an "
                                         r"IDX file.*magic number is 305419896"):
        mnist_data.load_mnist(tmp_path)
    # Labels where images belong.
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", 2049, (2,), bytes(2))
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        mnist_data.load_mnist(tmp_path)
    # The right magic, but not MNIST's dimensions.
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", 2051, (2, 28, 28),
               bytes(2 * 28 * 28))
    with pytest.raises(ValueError, match=r"dimensions \(2, 28, 28\).*expected "
                                         r"\(60000, 28, 28\)"):
        mnist_data.load_mnist(tmp_path)
    # A header cut short, and data shorter than the header announces.
    with pytest.raises(ValueError, match="truncated IDX header"):
        mnist_data.parse_idx(np.array([2051, 60000], dtype=">u4").tobytes())
    with pytest.raises(ValueError, match="truncated or has trailing bytes"):
        mnist_data.parse_idx(np.array([2049, 5], dtype=">u4").tobytes() + bytes(4))
    with pytest.raises(ValueError, match="fewer than the 4"):
        mnist_data.parse_idx(b"\x00\x00")


def test_loader_rejects_changed_contents(tmp_path):
    for name in mnist_data.FILES:
        shutil.copy(os.path.join(DATA_DIR, f"{name}.gz"), tmp_path)
    # Uncompressed files are read too; change one test label.
    with gzip.open(os.path.join(DATA_DIR, "t10k-labels-idx1-ubyte.gz"), "rb") as f:
        data = bytearray(f.read())
    data[-1] = (data[-1] + 1) % 10
    os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        mnist_data.load_mnist(tmp_path)
    (_, _), (_, y_test) = mnist_data.load_mnist(tmp_path, verify=False)
    assert y_test[-1] == data[-1]


def test_loader_reports_missing_directories_and_files(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mnist_data.load_mnist(tmp_path / "nowhere")
    monkeypatch.setenv("KERASDIST_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"\$KERASDIST_DATA_DIR"):
        mnist_data.load_mnist()
    monkeypatch.setenv("KERASDIST_DATA_DIR", str(tmp_path))  # empty directory
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz"):
        mnist_data.load_mnist()


# The examples, on 2 ranks.


def test_keras_mnist_two_ranks(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    _, out = run_example("keras_mnist.py",
                         QUICK + ["--checkpoint-dir", checkpoints],
                         tool="kerasdist-run")
    assert "2 rank(s), global batch 128 = 64 per rank" in out
    assert printed_accuracy(out) > 0.5
    assert re.search(r"^(?:\[0\] )?wall time: [\d.]+ s$", out, re.MULTILINE)
    # Only rank 0 saved, once, and no temporary file was left behind.
    assert os.listdir(checkpoints) == ["mnist.keras"]
    assert len(re.findall(r"rank 0 saved .*mnist\.keras", out)) == 1
    assert not re.search(r"^\[1\].*saved", out, re.MULTILINE)


def test_keras_mnist_custom_loop_two_ranks():
    _, out = run_example("keras_mnist_custom_loop.py", QUICK + ["--log-every", "10"])
    assert "2 rank(s), global batch 128 = 64 per rank" in out
    assert len(re.findall(r"^epoch 1/1: loss", out, re.MULTILINE)) == 1
    assert printed_accuracy(out) > 0.5


def test_keras_mnist_resume_after_crash(tmp_path):
    backup = tmp_path / "backup"
    args = ["--epochs", "2", "--steps-per-epoch", "5", "--backup-dir", backup]
    code, out = run_example("keras_mnist_resume.py", args + ["--crash-after-epoch", "1"],
                            check=False)
    assert code != 0, out[-4000:]
    assert "starting at epoch 1/2" in out
    assert "simulated crash at the end of epoch 1" in out
    assert "test accuracy:" not in out
    assert os.listdir(backup), "no backup was written before the crash"

    _, out = run_example("keras_mnist_resume.py", args)
    assert out.count("resuming at epoch 2/2") == 1
    assert "starting at epoch 1" not in out
    printed_accuracy(out)
    assert os.listdir(backup) == []  # deleted once training completed


def _digests(out):
    return dict(re.findall(r"rank (\d+) weights digest: ([0-9a-f]+)", out))


def test_pytorch_mnist_two_ranks_ends_with_identical_replicas():
    _, out = run_example("pytorch_mnist.py", ["--epochs", "1", "--steps-per-epoch", "200"],
                         tool="kerasdist-run")
    assert "2 rank(s), 64 examples per rank per step" in out
    digests = _digests(out)
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, out[-3000:]
    assert printed_accuracy(out) > 0.5


def test_pytorch_mnist_fp16_allreduce():
    _, out = run_example("pytorch_mnist.py", ["--epochs", "1", "--steps-per-epoch", "30",
                                              "--fp16-allreduce"])
    assert len(set(_digests(out).values())) == 1, out[-3000:]
    assert printed_accuracy(out) > 0.2


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_keras_mnist_on_another_backend_ends_with_identical_replicas(backend):
    pytest.importorskip(backend)
    _, out = run_example(f"keras_{backend}_mnist.py",
                         ["--epochs", "1", "--steps-per-epoch", "60"],
                         tool="kerasdist-run", timeout=300)
    assert f"2 rank(s), 64 examples per rank per step, backend {backend}" in out
    digests = _digests(out)
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, out[-3000:]
    assert printed_accuracy(out) > 0.5
