"""Tests for `kerasdist-run`'s hosts (kerasdist/runner/hosts.py): `-H`,
`--hostfile`, Slurm allocations (parsed without Slurm), rank placement and
the mpiexec host options; and the restart policy (kerasdist/runner/restarts.py)."""

import subprocess
import sys

import pytest

from kerasdist.runner import cli as runner
from kerasdist.runner import hosts as _hosts
from kerasdist.runner.restarts import RestartPolicy

MPIEXEC = "/opt/mpi/bin/mpiexec"


def argv_of(*cli, flavor="mpich", **kwargs):
    args = runner.parse_args([str(a) for a in cli])
    return runner.build_mpiexec_argv(args, MPIEXEC, flavor, **kwargs)


def option(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("nodelist,expected", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[8-11],login1", ["a8", "a9", "a10", "a11", "login1"]),
    ("gpu-[1-2]-x,cpu[007]", ["gpu-1-x", "gpu-2-x", "cpu007"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
])
def test_expand_nodelist(nodelist, expected):
    assert _hosts.expand_nodelist(nodelist) == expected


@pytest.mark.parametrize("nodelist", ["n[1-", "n[3-1]", "n[a-b]", "n[]", "a,,b",
                                      "n]1[", ""])
def test_expand_nodelist_invalid(nodelist):
    with pytest.raises(ValueError, match="Invalid value for `SLURM_JOB_NODELIST`"):
        _hosts.expand_nodelist(nodelist)


def test_expand_tasks_per_node():
    assert _hosts.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert _hosts.expand_tasks_per_node("4") == [4]
    for bad in ("2(x0)", "x", "2(3)", ""):
        with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
            _hosts.expand_tasks_per_node(bad)


def test_slurm_hosts():
    env = {"SLURM_JOB_NODELIST": "node[01-03],big", "SLURM_TASKS_PER_NODE": "2(x3),4"}
    assert _hosts.slurm_hosts(env) == [("node01", 2), ("node02", 2),
                                       ("node03", 2), ("big", 4)]
    assert _hosts.slurm_hosts({"SLURM_NODELIST": "a[1-2]",
                               "SLURM_JOB_CPUS_PER_NODE": "8(x2)"}) == [
        ("a1", 8), ("a2", 8)]
    assert _hosts.slurm_hosts({"SLURM_JOB_NODELIST": "a[1-2]"}) == [("a1", 1), ("a2", 1)]
    assert _hosts.slurm_hosts({"SLURM_JOB_ID": "7"}) is None  # No allocation.
    with pytest.raises(ValueError, match="Expected one count per node"):
        _hosts.slurm_hosts({"SLURM_JOB_NODELIST": "a[1-3]",
                            "SLURM_TASKS_PER_NODE": "2(x2)"})


def test_parse_hosts_merges_repeated_hosts():
    assert _hosts.parse_hosts("b:2,a,b:1") == [("b", 3), ("a", 1)]


def test_parse_hostfile():
    text = "# cluster\nh1:2\nh2 slots=3 max_slots=4  # big\n\nh3\nh1\n"
    assert _hosts.parse_hostfile(text) == [("h1", 3), ("h2", 3), ("h3", 1)]
    for bad in ("h1:0\n", "h1 cores=2\n", ":2\n"):
        with pytest.raises(ValueError, match="Invalid value for argument `--hostfile`"):
            _hosts.parse_hostfile(bad, "f")
    with pytest.raises(ValueError, match="Expected at least one host"):
        _hosts.parse_hostfile("# nothing\n", "f")


@pytest.mark.parametrize("np,expected", [
    (4, [("a", 2), ("b", 2)]),
    (3, [("a", 2), ("b", 1)]),
    (1, [("a", 1)]),
    (7, [("a", 4), ("b", 3)]),  # Oversubscribed: extra ranks shared.
])
def test_place_keeps_each_hosts_ranks_contiguous(np, expected):
    placement = _hosts.place([("a", 2), ("b", 2)], np)
    assert placement == expected
    ranks = [_hosts.host_of_rank(placement, r) for r in range(np)]
    assert ranks == sorted(ranks, key=[h for h, _ in placement].index)
    assert _hosts.host_of_rank(placement, np) is None


def test_argv_hosts_in_rank_order():
    argv = argv_of("-np", 5, "-H", "h1:2,h2:2,h1:1", "prog")
    assert option(argv, "-hosts") == "h1:3,h2:2"  # h1's ranks: 0-2.
    assert option(argv, "-n") == "5"
    argv = argv_of("-np", 3, "-H", "h1:2,h2:2", "prog", flavor="openmpi")
    assert option(argv, "-H") == "h1:2,h2:1" and option(argv, "-np") == "3"
    argv = argv_of("-np", 8, "prog", placement=[("x", 3), ("y", 1)])
    assert option(argv, "-hosts") == "x:3,y:1" and option(argv, "-n") == "4"


def test_hostfile_argv(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1 slots=2\nh2 slots=2\n")  # Open MPI style.
    argv = argv_of("-np", 4, "--hostfile", hostfile, "prog")
    assert option(argv, "-hosts") == "h1:2,h2:2" and "-f" not in argv


def test_slurm_allocation_is_used_without_hosts():
    env = {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    args = runner.parse_args(["-np", "4", "prog"])
    hosts, source = runner.resolve_hosts(args, env)
    assert (hosts, source) == ([("node01", 2), ("node02", 2)], "the Slurm allocation")
    argv = runner.build_mpiexec_argv(args, MPIEXEC, "mpich",
                                     _hosts.place(hosts, args.np))
    assert option(argv, "-hosts") == "node01:2,node02:2"
    args = runner.parse_args(["-np", "2", "-H", "x:2", "prog"])  # -H wins.
    assert runner.resolve_hosts(args, env) == ([("x", 2)], "-H")
    args = runner.parse_args(["-np", "2", "prog"])  # Not under Slurm.
    assert runner.resolve_hosts(args, {"PATH": "/bin"}) == (None, None)
    assert "-hosts" not in runner.build_mpiexec_argv(args, MPIEXEC)


@pytest.mark.parametrize("cli,message", [
    (["--max-restarts", "-1"], "Invalid value for argument `--max-restarts`. "
     "Expected a non-negative integer. Received: --max-restarts=-1"),
    (["--min-np", "0"], "Invalid value for argument `--min-np`. Expected a "
     "positive integer. Received: --min-np=0"),
    (["--min-np", "5"], "Invalid value for argument `--min-np`. Expected at "
     "most -np=4. Received: --min-np=5"),
])
def test_invalid_restart_flags(cli, message):
    with pytest.raises(ValueError) as info:
        runner.parse_args(["-np", "4", *cli, "prog"])
    assert str(info.value) == message


def test_restart_policy_without_hosts():
    policy = RestartPolicy(2, None, max_restarts=2, min_np=1)
    assert policy.after_failure(1) == (True, [])
    assert policy.after_failure(1) == (True, [])  # No hosts: none left out.
    assert policy.after_failure(1) == (False, [])
    assert (policy.np, policy.placement, policy.restarts) == (2, None, 2)


def test_restart_policy_leaves_out_a_host_failing_twice_in_a_row():
    policy = RestartPolicy(4, [("a", 2), ("b", 2)], max_restarts=6, min_np=2)
    assert policy.after_failure(2) == (True, [])  # b once
    assert policy.after_failure(0) == (True, [])  # a: no longer b's streak
    assert policy.after_failure(3) == (True, [])  # b
    restart, notes = policy.after_failure(2)  # b again: left out
    assert restart and notes == [
        "leaving out host b (it failed twice in a row): 2 ranks on a:2"]
    assert (policy.np, policy.placement) == (2, [("a", 2)])
    assert policy.after_failure(1) == (True, [])
    restart, notes = policy.after_failure(0)  # a twice, but 0 < min_np
    assert restart and "fewer than --min-np=2; keeping it" in notes[0]
    assert (policy.np, policy.placement, policy.restarts) == (2, [("a", 2)], 6)
    assert policy.after_failure(None) == (False, [])


def test_restart_policy_needs_min_np_to_leave_out_hosts():
    policy = RestartPolicy(4, [("a", 2), ("b", 2)], max_restarts=3)
    for _ in range(3):
        assert policy.after_failure(3) == (True, [])
    assert policy.placement == [("a", 2), ("b", 2)]


def test_verbose_shows_hosts_and_argv():
    # localhost and 127.0.0.1 are two hosts to Hydra, both started locally.
    out = subprocess.run(
        [sys.executable, "-m", "kerasdist.runner", "-np", "3", "--verbose", "-H",
         "localhost:1,127.0.0.1:1,localhost:1", "sh", "-c",
         'echo "host=$PMI_HOSTNAME"'],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "kerasdist-run: hosts from -H: localhost:2,127.0.0.1:1" in out.stderr
    assert " -hosts localhost:2,127.0.0.1:1 " in out.stderr
    assert sorted(out.stdout.splitlines()) == [
        "[0] host=localhost", "[1] host=localhost", "[2] host=127.0.0.1"]
