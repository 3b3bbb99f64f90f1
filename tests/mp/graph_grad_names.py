"""Gradients of collectives in a tf.compat.v1 graph: the gradient's
collective is named after the forward op, so ranks whose forward ops agree
agree on it even when their `gradients_<n>/` scopes differ; a broadcast's
gradient runs its allreduce on every rank (off the root too, where the
result is zeros); a second gradient through one op gets a name of its own.
Over every rank and over the even/odd process sets registered at init
(np=4). Values against numpy. Run with a short deadlock bound: a rank
waiting on a differently named collective fails fast."""

import itertools

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _static_sets import EVEN, ODD, static_sets
from _util import log, main


def sets(size, r):
    out = [(None, list(range(size)))]
    if size == 4:
        mine = EVEN if r % 2 == 0 else ODD
        out.append((mine, mine.ranks))
    return out


def session_configs():
    """A default session, and one without Grappler's constant folding and
    graph optimizations, as tf.test.TestCase's sessions (and Horovod's tests)."""
    plain = tf.compat.v1.ConfigProto()
    as_tf_test = tf.compat.v1.ConfigProto()
    as_tf_test.graph_options.optimizer_options.opt_level = -1
    rewrite = as_tf_test.graph_options.rewrite_options
    rewrite.constant_folding = rewrite.OFF
    return [plain, as_tf_test]


def check_broadcast_gradient(size, r):
    # Horovod's test_horovod_broadcast_grad_cpu(_process_sets), graph half.
    for (process_set, ranks), config in itertools.product(sets(size, r), session_configs()):
        with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session(config=config) as sess:
            for dim, root in itertools.product((1, 2), ranks):
                x = tf.ones([3] * dim) * r
                y = kd.broadcast(x, root, process_set=process_set)
                grad = tf.gradients(y, x, tf.ones([3] * dim))[0]
                want = np.full([3] * dim, 1.0 if r == root else 0.0)
                np.testing.assert_array_equal(sess.run(grad), want)


def check_names_follow_the_forward_op(size, r):
    for process_set, ranks in sets(size, r):
        with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
            x = tf.constant([1.0, 2.0]) * (r + 1)
            if r == ranks[0]:  # a local gradient: this rank's scopes run ahead
                tf.gradients(x * x, x)
            y = kd.allreduce(x, op=kd.Sum, process_set=process_set)
            g1 = tf.gradients(y * 2.0, x)[0]
            g2 = tf.gradients(y * 3.0, x)[0]  # through the same op again
            grads = [op for op in tf.compat.v1.get_default_graph().get_operations()
                     if op.type == "KerasdistAllreduce" and op is not y.op]
            names = sorted(op.get_attr("tensor_name").decode() for op in grads)
            assert names == [y.op.name + ".grad", y.op.name + ".grad.1"], names
            got1, got2 = sess.run([g1, g2])  # both in flight at once
            np.testing.assert_array_equal(got1, np.full([2], 2.0 * len(ranks)))
            np.testing.assert_array_equal(got2, np.full([2], 3.0 * len(ranks)))
    kd.barrier()


def run():
    size, r = kd.size(), kd.rank()
    for check in (check_broadcast_gradient, check_names_follow_the_forward_op):
        check(size, r)
        log(check.__name__, "passed")


if __name__ == "__main__":
    kd.init(process_sets=static_sets())
    main(run)
