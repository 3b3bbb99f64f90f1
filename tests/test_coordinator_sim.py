"""benchmarks/coordinator_sim.cc at small N: the real Coordinator and message
codec, driven by simulated ranks (no MPI, no TensorFlow), plan every tensor
exactly once, fused as expected, whatever the order and split of the
submissions. Correctness only: no timing is asserted (machines are noisy)."""

import importlib.util
import os
import shutil

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(os.path.dirname(HERE), "benchmarks", "coordinator_sim.py")


def _driver():
    spec = importlib.util.spec_from_file_location("coordinator_sim", DRIVER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sim = _driver()


@pytest.fixture(scope="module")
def exe():
    if not shutil.which(sim.compiler()):
        pytest.skip(f"no C++ compiler ({sim.compiler()})")
    return sim.build()


def test_every_tensor_planned_once_in_one_fused_response(exe):
    rc, rows, err = sim.run(exe, [8, 64], steps=5, check_steps=3, timeout=300)
    assert rc == 0, err[-4000:]
    assert [r["ranks"] for r in rows] == [8, 64]
    for r in rows:
        assert r["ok"] and r["errors"] == 0, (r, err[-4000:])
        # 200 tensors (61 MB of float32) fit the default 64 MiB buffer.
        assert r["responses_per_step"] == 1, r
        assert set(r["scenarios"]) == {"inorder", "reversed", "split", "shuffled"}
        s = r["scenarios"]["inorder"]
        # Workers send ids only: a 17-byte header and 4 bytes per tensor.
        assert s["bytes_received"] == (r["ranks"] - 1) * (17 + 4 * 200), s
        assert s["bytes_sent"] % (r["ranks"] - 1) == 0, s


def test_small_fusion_buffer_splits_greedily(exe):
    rc, rows, err = sim.run(exe, [8], steps=3, check_steps=3, fusion_bytes=4 << 20,
                            timeout=300)
    assert rc == 0, err[-4000:]
    assert rows[0]["ok"] and rows[0]["responses_per_step"] > 1, rows


def test_tensors_at_the_fusion_tensor_limit_are_planned_alone(exe):
    # The model's largest kernels (3x3x128x256 and 3x3x256x256 float32, 1.2
    # and 2.4 MB) reach a 1 MiB limit: each is its own response, and the
    # rest still fuse into one. Step() fails the run if a tensor at the limit
    # shares a response or a fusion group is closed early.
    rc, rows, err = sim.run(exe, [8], steps=3, check_steps=3, tensor_limit=1 << 20,
                            timeout=300)
    assert rc == 0, err[-4000:]
    m = sim_model_bytes(200)
    alone = sum(b >= 1 << 20 for b in m)
    assert alone > 0
    assert rows[0]["ok"] and rows[0]["responses_per_step"] == alone + 1, rows


def sim_model_bytes(n):
    """The tensor sizes of coordinator_sim.cc's MakeModel(n), in bytes."""
    out, cin = [], 3
    for i in range(n):
        layer = i // 2
        cout = 16 << min(4, layer * 5 // max(1, n // 2))
        if i % 2 == 0:
            out.append(3 * 3 * cin * cout * 4)
        else:
            out.append(cout * 4)
            cin = cout
    return out


def test_a_missing_submission_fails_the_checks(exe):
    rc, rows, err = sim.run(exe, [8], steps=3, check_steps=1, timeout=300, drop_one=True)
    assert rc == 1, (rc, err[-4000:])
    assert not rows[0]["ok"]
    assert "CHECK FAIL" in err and "planned 0 times" in err, err[-4000:]
