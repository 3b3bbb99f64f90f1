"""Size-1 tests under plain pytest: API, errors, identity, shape functions."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import kerasdist as kd


@pytest.fixture(autouse=True)
def initialized():
    kd.init()
    yield


def test_errors_before_init_then_reinit():
    kd.shutdown()
    for fn in (kd.rank, kd.size, kd.local_rank, kd.local_size, kd.cross_rank,
               kd.cross_size, lambda: kd.allreduce(tf.ones([1])),
               lambda: kd.allgather(tf.ones([1])), lambda: kd.broadcast(tf.ones([1]), 0),
               kd.barrier, lambda: kd.broadcast_object(1)):
        with pytest.raises(RuntimeError, match=r"Call `kerasdist.init\(\)` first"):
            fn()
    kd.init()
    kd.init()
    assert kd.is_initialized() and kd.size() == 1 and kd.rank() == 0
    assert (kd.local_rank(), kd.local_size(), kd.cross_rank(), kd.cross_size()) == (0, 1, 0, 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64",
                                   "int32", "int64", "uint8", "int8"])
def test_size_one_identity(dtype):
    x = tf.cast(tf.reshape(tf.range(12), [3, 4]), dtype)
    for op in (kd.Sum, kd.Average, kd.Min, kd.Max, kd.Product):
        np.testing.assert_array_equal(kd.allreduce(x, op=op).numpy(), x.numpy())
    np.testing.assert_array_equal(kd.allgather(x).numpy(), x.numpy())
    np.testing.assert_array_equal(kd.broadcast(x, 0).numpy(), x.numpy())


def test_scales_compression_and_objects():
    x = tf.constant([1.0, 2.0])
    np.testing.assert_allclose(kd.allreduce(x, prescale_factor=3.0, postscale_factor=0.5), [1.5, 3.0])
    for comp in (kd.Compression.fp16, kd.Compression.bf16):
        y = kd.allreduce(x, compression=comp)
        assert y.dtype == tf.float32
        np.testing.assert_allclose(y.numpy(), x.numpy())
    assert kd.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
    assert kd.allgather_object("x") == ["x"]
    v = tf.Variable([5.0])
    kd.broadcast_variables([v], root_rank=0)
    assert v.numpy()[0] == 5.0
    kd.barrier()
    assert kd.join() == 0


def test_shape_functions():
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def fn(t):
        a = kd.allreduce(t)
        g = kd.allgather(t)
        b = kd.broadcast(t, 0)
        assert a.shape.as_list() == [None, 3]
        assert b.shape.as_list() == [None, 3]
        assert g.shape.as_list() == [None, 3]
        return a + b

    @tf.function(input_signature=[tf.TensorSpec([5, 2], tf.float32)])
    def fixed(t):
        assert kd.allgather(t).shape.as_list() == [None, 2]
        assert kd.allreduce(t).shape.as_list() == [5, 2]
        return t

    fn(tf.ones([2, 3]))
    fixed(tf.ones([5, 2]))


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError, match="Invalid value for argument `op`"):
        kd.allreduce(tf.ones([1]), op=7)
    with pytest.raises(TypeError, match="Unsupported dtype for `allreduce`.*complex64"):
        kd.allreduce(tf.ones([1], tf.complex64))
    with pytest.raises(ValueError, match="at least one dimension"):
        kd.allgather(tf.constant(1.0))
    with pytest.raises(ValueError, match="Invalid value for argument `root_rank`"):
        kd.broadcast(tf.ones([1]), root_rank=1)
    with pytest.raises(ValueError, match="Invalid value for argument `name`"):
        kd.allreduce(tf.ones([1]), name="")


def test_xla_compiled_step_gives_clear_error():
    @tf.function(jit_compile=True)
    def step(x):
        return kd.allreduce(x)

    with pytest.raises(ValueError, match="jit_compile=False"):
        step(tf.ones([2]))

    @tf.function(jit_compile=False)
    def plain(x):
        return kd.allreduce(x)

    np.testing.assert_array_equal(plain(tf.ones([2])).numpy(), [1.0, 1.0])


def test_gradient_at_size_one():
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(kd.allreduce(w * w, op=kd.Sum))
    np.testing.assert_allclose(tape.gradient(loss, w).numpy(), [2.0, 4.0])


def test_invalid_environment_variable_is_reported():
    code = ("import kerasdist as kd\n"
            "try:\n    kd.init()\nexcept ValueError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, KERASDIST_CYCLE_TIME="fast", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    assert "KERASDIST_CYCLE_TIME" in out and "'fast'" in out
    env = dict(os.environ, KERASDIST_SHM="maybe", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    assert "KERASDIST_SHM" in out and "'maybe'" in out


def test_non_finite_and_negative_settings_are_rejected():
    code = (
        "import os\nfrom kerasdist.common import config\n"
        "for name, raw in [('KERASDIST_TIMEOUT_SECONDS', 'nan'),\n"
        "                  ('KERASDIST_TIMEOUT_SECONDS', 'inf'),\n"
        "                  ('KERASDIST_DEADLOCK_TIME_SECONDS', '-1'),\n"
        "                  ('KERASDIST_SEGMENT_BYTES', '0'),\n"
        "                  ('KERASDIST_FUSION_THRESHOLD', '1.5'),\n"
        "                  ('KERASDIST_SPIN_MICROSECONDS', '-1')]:\n"
        "    os.environ[name] = raw\n"
        "    try:\n        config.read_config()\n        print('ACCEPTED', name, raw)\n"
        "    except ValueError as e:\n        print('ERR', e)\n"
        "    del os.environ[name]\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    assert "ACCEPTED" not in out, out
    assert out.count("ERR Invalid value for environment variable") == 6, out
    assert "KERASDIST_TIMEOUT_SECONDS='nan'" in out, out


def test_transport_info_at_size_one():
    assert kd.transport_info().startswith("mpi(")
    assert "shared memory" not in kd.transport_info()


def test_build_info():
    info = kd.build_info()
    assert info["tf_version"] == tf.__version__ == info["tf_built_against"]
    assert "kerasdist_allreduce" in info["ops"] and "MPICH" in info["mpi_library"]
