"""tests/blame.py reads who an error blames from every path's wording; the
texts below are the engine's, as printed by the fault tests."""

import pytest

import blame

_FN = "{{function_node __wrapped__KerasdistAllreduce_device_/job:localhost/replica:0/task:0/device:CPU:0}} "
_OP = " [Op:KerasdistAllreduce] name: "

# (text, blamed, state) as the engine wrote them.
TEXTS = [
    # The run: the timeout came while sending.
    (_FN + "rank 0/2: timed out after 3000 ms sending 262144 bytes to rank 1 in allreduce "
     "'big'; lost: rank 1 (host vm) (no answer to a roll call within 1.5 s)" + _OP,
     {1}, "transfer"),
    (_FN + "rank 0/2: timed out after 3000 ms receiving 262144 bytes from rank 1 in allreduce "
     "'big'; lost: rank 1 (host vm) (no answer to a roll call within 1.5 s)" + _OP,
     {1}, "transfer"),
    # np=3 ring: the peer waited on is healthy; the roll call names the lost one.
    ("rank 1/3: timed out after 5000 ms receiving 262144 bytes from rank 0 in allreduce "
     "'big'; lost: rank 2 (host vm) (no answer to a roll call within 2.0 s; rank 0 "
     "answered)", {2}, "transfer"),
    (_FN + "rank 0/3: rank 2 (host vm) has not answered rank 0 for 4 s while collectives "
     "wait: stopped or lost the connection (bound: KERASDIST_TIMEOUT_SECONDS); lost: rank 2 "
     "(host vm) (no answer to a roll call within 1.5 s; rank 1 answered)" + _OP,
     {2}, "silent worker"),
    (_FN + "rank 1/3: rank 0 (host vm) (the coordinator) has not answered for 4 s while this "
     "rank waits on collectives: it has stopped or lost its connection (bound: "
     "KERASDIST_TIMEOUT_SECONDS); lost: rank 0 (host vm) (no answer to a roll call within "
     "1.5 s; rank 2 answered)" + _OP, {0}, "silent coordinator"),
    # Rank 0 alive but blocked on the lost rank: only the lost one is blamed.
    ("rank 1/3: rank 0 (host vm) (the coordinator) has not answered for 5 s while this rank "
     "waits on collectives, though it is alive: it is blocked on a lost rank (bound: "
     "KERASDIST_TIMEOUT_SECONDS); lost: rank 2 (host vm) (no answer to a roll call within "
     "2.0 s; rank 0 answered)", {2}, "silent coordinator"),
    (_FN + "rank 0/2: Stall shutdown after 3 s: allreduce 'big' was submitted by ranks [0] "
     "but not by ranks [1] (KERASDIST_STALL_SHUTDOWN_TIME_SECONDS)." + _OP, {1}, "stall"),
    ("rank 0/2: rank 1 (host vm) has shown no sign of life for 4 s while allreduce 'd.f' "
     "waits for it: it has stopped or lost its connection (bound: KERASDIST_TIMEOUT_SECONDS)",
     {1}, "board"),
    ("rank 0/3: timed out after 10000 ms waiting for all ranks to call init(); ranks 1, 2 "
     "did not answer a roll call within 2 s (never reached init(), or stopped)",
     {1, 2}, "init"),
    ("rank 0/2: shut down, but rank 1 (host vm) did not acknowledge it within 4 s: frozen "
     "or gone", {1}, "shutdown"),
    ("rank 1/2: timed out after 5000 ms waiting for rank 0 to acknowledge shutdown",
     {0}, "shutdown"),
    # Two lost ranks on another host.
    ("rank 0/4: timed out after 5000 ms receiving 1048576 bytes from rank 3 in allreduce "
     "'g'; lost: rank 2 (host kdh2), rank 3 (host kdh2) (no answer to a roll call within "
     "2.0 s; rank 1 answered)", {2, 3}, "transfer"),
]


@pytest.mark.parametrize("text, lost, state", TEXTS)
def test_every_path_names_the_lost_ranks(text, lost, state):
    assert blame.blamed(text) == lost
    assert blame.check(text, lost) == state


def test_a_peer_or_a_prefix_alone_is_not_blame():
    # The transfer's peer, the rank's own prefix and an alive coordinator.
    text = ("rank 1/3: timed out after 5000 ms receiving 262144 bytes from rank 0 in "
            "allreduce 'big'; every other rank answered a roll call within 2.0 s, so none "
            "is lost: they are all waiting on each other")
    assert blame.blamed(text) == set()
    assert blame.transfer(text) == ("receiving", 0, "allreduce", "big")
    with pytest.raises(AssertionError):
        blame.check(text, 0)


@pytest.mark.parametrize("text, lost", [
    # No rank named at all (the peer alone does not count).
    ("rank 0/2: timed out after 3000 ms sending 262144 bytes to rank 1 in allreduce 'big'", 1),
    # The wrong rank.
    ("rank 2/3: timed out after 5000 ms receiving 262144 bytes from rank 1 in allreduce "
     "'big'; lost: rank 1 (host vm) (no answer to a roll call within 2.0 s)", 0),
    # The lost rank and a healthy one.
    ("rank 1/3: rank 0 (host vm) (the coordinator) has not answered for 5 s while this rank "
     "waits on collectives: it has stopped or lost its connection (bound: "
     "KERASDIST_TIMEOUT_SECONDS); lost: rank 0 (host vm), rank 2 (host vm) (no answer to a "
     "roll call within 2.0 s)", 2),
    ("some other error", 1),
])
def test_check_fails_on_a_wrong_or_missing_rank(text, lost):
    with pytest.raises(AssertionError):
        blame.check(text, lost)
