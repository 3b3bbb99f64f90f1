"""broadcast_object and allgather_object in a tf.compat.v1 graph, with a
given session, the default one or none (they run at once through the engine
library), over every rank and over the even/odd process sets registered at
init (np=2 or 4); against what each rank sent."""

import tensorflow as tf

import kerasdist as kd
from _static_sets import EVEN, ODD, static_sets
from _util import log, main


def payload(r):
    return {"rank": r, "pad": "x" * (100 * r), 0: [1, 2]}


def check_global(size, r):
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        got = kd.broadcast_object(payload(r), root_rank=size - 1, session=sess)
        assert got == payload(size - 1), got
        assert kd.allgather_object(payload(r), session=sess) == [payload(q) for q in range(size)]
        assert kd.broadcast_object(None if r else [3.5], 0, sess, "named") == [3.5]
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session().as_default():
        assert kd.broadcast_object(r * 10, root_rank=0) == 0  # the default session
        assert kd.allgather_object(r) == list(range(size))
    with tf.compat.v1.Graph().as_default():  # no session: the engine needs none
        assert kd.broadcast_object(payload(r), root_rank=1) == payload(1)
        assert kd.allgather_object(r * 2) == [2 * q for q in range(size)]


def check_process_sets(size, r):
    if size != 4:
        return
    mine = EVEN if r % 2 == 0 else ODD
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        root = mine.ranks[-1]
        got = kd.broadcast_object(payload(r), root_rank=root, session=sess, process_set=mine)
        assert got == payload(root), got
        got = kd.allgather_object(payload(r), session=sess, process_set=mine)
        assert got == [payload(q) for q in mine.ranks], got


def run():
    size, r = kd.size(), kd.rank()
    for check in (check_global, check_process_sets):
        check(size, r)
        log(check.__name__, "passed")


if __name__ == "__main__":
    kd.init(process_sets=static_sets())
    main(run)
