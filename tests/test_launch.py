"""Tests for `kerasdist.run()` (kerasdist/runner/launch.py), the notebook launcher.

Three launches in all (each rank importing TensorFlow is the slow part):
a successful run shared by several tests, a failing run, and a timeout.
Every launch is bounded by `timeout`, so a hang fails instead of blocking.
"""

import contextlib
import io
import os
import re
import threading
import time

import pytest

from kerasdist.runner.launch import run

# Quiet TensorFlow's C++ logs on the ranks; the value checks quoting.
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "KD_LAUNCH_TEST": "it's a $HOME; test"}


def _prefixed(text, rank):
    """Lines of `text` relayed from `rank`, without the prefix."""
    return [m.group(1) for m in re.finditer(rf"^\[{rank}\] (.*)$", text, re.M)]


@pytest.fixture(scope="module")
def success():
    """Runs a closure on 2 ranks once; returns (results, stdout, seconds).

    stdout is a StringIO here (no `.buffer`, like a notebook's stream)."""
    greeting = "hello"  # A closure over a local: plain pickle can't send it.

    def fn():
        import tensorflow as tf

        import kerasdist as kd

        kd.init()
        print(f"{greeting} from rank {kd.rank()}: "
              f"KD_LAUNCH_TEST={os.environ['KD_LAUNCH_TEST']}")
        return (kd.rank(), kd.size(),
                float(kd.allreduce(tf.constant(1.0), op=kd.Sum)))

    out = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out):
        results = run(fn, np=2, env=ENV, timeout=120)
    return results, out.getvalue(), time.monotonic() - start


def test_returns_per_rank_values_in_rank_order(success):
    results, _, _ = success
    assert results == [(0, 2, 2.0), (1, 2, 2.0)]


def test_output_is_streamed_with_rank_prefixes(success):
    _, out, _ = success
    for rank in (0, 1):
        lines = [l for l in _prefixed(out, rank) if l.startswith("hello from")]
        assert lines and lines[0].startswith(f"hello from rank {rank}:"), out


def test_env_reaches_the_ranks(success):
    _, out, _ = success
    for rank in (0, 1):
        assert (f"hello from rank {rank}: KD_LAUNCH_TEST={ENV['KD_LAUNCH_TEST']}"
                in _prefixed(out, rank)), out


def test_failing_rank_raises_with_its_traceback(capsys):
    marker = "boom-on-rank-one"

    def fn():
        import tensorflow as tf

        import kerasdist as kd

        kd.init()
        if kd.rank() == 1:
            print("rank 1 is about to fail")
            raise ValueError(f"{marker} (rank {kd.rank()})")
        # Rank 0 waits in a collective that rank 1 never joins.
        return float(kd.allreduce(tf.constant(1.0), op=kd.Sum))

    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        run(fn, np=2, env=ENV, timeout=120)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert re.match(r"kerasdist\.run: ranks? .*1.* of 2 failed", message), message
    assert "Rank 1 failed: ValueError: boom-on-rank-one (rank 1)" in message
    assert "Traceback (most recent call last):" in message
    # The frame of the function sent by value names this file and the line.
    assert "test_launch.py" in message, message
    assert 'raise ValueError(f"{marker} (rank {kd.rank()})")' in message
    # capsys's stdout has a `.buffer`: the other path of the output relay.
    assert "rank 1 is about to fail" in _prefixed(capsys.readouterr().out, 1)
    # A failed rank does not leave the others waiting: they error out or
    # are stopped after a grace period.
    assert elapsed < 100, elapsed


def test_timeout_stops_the_ranks(tmp_path):
    def sleeper():
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
        (tmp_path / f"pid.{rank}").write_text(str(os.getpid()))
        print("sleeping", flush=True)
        time.sleep(300)

    out = io.StringIO()
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info, contextlib.redirect_stdout(out):
        run(sleeper, np=2, timeout=6)
    elapsed = time.monotonic() - start
    assert elapsed < 6 + 8, elapsed
    assert re.search(r"timed out after 6 s: ranks 0 and 1 of 2 had not "
                     "finished", str(info.value)), str(info.value)
    assert "sleeping" in _prefixed(out.getvalue(), 0), out.getvalue()
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in (0, 1)]
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        time.sleep(0.1)
    assert not alive, f"Rank processes {alive} survived the timeout."


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _unused():
    pass


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(fn=42), TypeError, r"argument `fn`. Expected a callable"),
    (dict(np=0), ValueError, r"argument `np`. Expected a positive integer. "
                             r"Received: np=0"),
    (dict(np=-3), ValueError, r"np=-3"),
    (dict(np="2"), TypeError, r"argument `np`"),
    (dict(np=True), TypeError, r"argument `np`"),
    (dict(args="abc"), TypeError, r"argument `args`"),
    (dict(kwargs=[1]), TypeError, r"argument `kwargs`"),
    (dict(env=["A=1"]), TypeError, r"argument `env`. Expected a dict of str"),
    (dict(env={"A": 1}), TypeError, r"argument `env`.*'A': 1"),
    (dict(env={1: "a"}), TypeError, r"argument `env`"),
    (dict(env={"A=B": "1"}), ValueError, r"argument `env`"),
    (dict(timeout=0), ValueError, r"argument `timeout`"),
    (dict(timeout="5"), TypeError, r"argument `timeout`"),
    (dict(hosts="h1:x"), ValueError, r"argument `hosts`.*Received: hosts='h1:x'"),
    (dict(hosts=["h1"]), TypeError, r"argument `hosts`"),
])
def test_invalid_arguments(kwargs, error, match):
    call = dict(fn=_unused)
    call.update(kwargs)
    with pytest.raises(error, match=match):
        run(**call)


def test_unpicklable_function_is_a_clear_error():
    lock = threading.Lock()

    def fn():
        return lock.locked()

    with pytest.raises(TypeError, match="could not serialize `fn`"):
        run(fn)
