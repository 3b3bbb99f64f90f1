"""broadcast_variables and broadcast_global_variables in a tf.compat.v1
graph: each returns the op to run, and running it gives every rank the
root's values (over every rank, and over the even/odd process sets
registered at init at np=4). Eagerly, broadcast_global_variables raises
RuntimeError, as in Horovod."""

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _static_sets import EVEN, ODD, static_sets
from _util import log, main


def variables(r):
    return [tf.Variable(np.full([3, 2], r, np.float32)), tf.Variable([r, 7 * r], dtype=tf.int64)]


def values(root):
    return [np.full([3, 2], root, np.float32), np.array([root, 7 * root], np.int64)]


def assert_values(got, root):
    for a, b in zip(got, values(root)):
        np.testing.assert_array_equal(a, b)


def check_broadcast_variables(size, r):
    sets = [(None, size - 1)]
    if size == 4:
        mine = EVEN if r % 2 == 0 else ODD
        sets.append((mine, mine.ranks[-1]))
    for process_set, root in sets:
        for inplace in (False, True):
            with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
                vs = variables(r)
                sess.run(tf.compat.v1.global_variables_initializer())
                op = kd.broadcast_variables(vs, root_rank=root, process_set=process_set,
                                            inplace=inplace)
                assert isinstance(op, tf.Operation), op
                assert_values(sess.run(vs), r)  # nothing ran yet
                sess.run(op)
                assert_values(sess.run(vs), root)
    vs = variables(r)  # eagerly: done at once, nothing to run
    assert kd.broadcast_variables(vs, root_rank=0) is None
    assert_values([v.numpy() for v in vs], 0)


def check_broadcast_global_variables(size, r):
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        vs = variables(r)
        sess.run(tf.compat.v1.global_variables_initializer())
        op = kd.broadcast_global_variables(size - 1)
        assert isinstance(op, tf.Operation), op
        sess.run(op)
        assert_values(sess.run(vs), size - 1)
    with tf.compat.v1.Graph().as_default():
        try:
            kd.broadcast_global_variables(size)  # checked with no variables too
            raise AssertionError("expected ValueError")
        except ValueError as e:
            assert "Invalid value for argument `root_rank`" in str(e), e
    try:
        kd.broadcast_global_variables(0)
        raise AssertionError("expected RuntimeError")
    except RuntimeError as e:
        assert "does not support eager execution" in str(e), e
    kd.barrier()  # the engine is fine: nothing was enqueued


def run():
    size, r = kd.size(), kd.rank()
    for check in (check_broadcast_variables, check_broadcast_global_variables):
        check(size, r)
        log(check.__name__, "passed")


if __name__ == "__main__":
    kd.init(process_sets=static_sets())
    main(run)
