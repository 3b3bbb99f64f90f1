"""A host that dies or drops off the network, on namespaced test hosts
(`tests/hosts.py`), and the hierarchical allreduce across hosts.

Faults hit the last host of a layout while every rank runs a loop of 4 MiB
allreduces (`multihost/fault_loop.py`), with KERASDIST_TIMEOUT_SECONDS=5:
- `kill`: every rank of that host is SIGKILLed, from inside the host;
- `link`: the host's `eth0` goes down (`ip link set eth0 down` inside it).
Each runs under plain `mpiexec` (hydra) and under `kerasdist-run`. The
surviving ranks must stop within BOUND_S with an error that names a lost
rank and its host, and no process may be left on any host afterwards.
Each case gets a fresh cluster, so a cut link never leaks into the next.

Known limit (MPICH's hydra, not kerasdist): under plain `mpiexec`, after a
link cut every rank on every host ends by itself, but `mpiexec` keeps
waiting for the unreachable host's proxy forever; that case is an
xfail(strict=True), and the test ends `mpiexec` itself.
"""

import os
import re
import sys
import tempfile
import threading
import time

import pytest

import hosts

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "multihost", "fault_loop.py")
SUITE = os.path.join(HERE, "multihost", "suite.py")
KDRUN = os.path.join(os.path.dirname(sys.executable), "kerasdist-run")
ENV = {"KERASDIST_TIMEOUT_SECONDS": "5", "KERASDIST_INIT_TIMEOUT_SECONDS": "60"}
BOUND_S = 20.0  # survivors' error after the fault (liveness bound is 5 s)
EXIT_BOUND_S = 60.0  # every rank process gone after the fault
JOB_TIMEOUT = 150
MIB = 1 << 20


class Outcome:
    """What happened around one injected fault (times are after the fault)."""

    def __init__(self, cluster, slots):
        self.cluster, self.slots = cluster, slots
        self.victim = len(slots)
        first = sum(slots[:-1])
        self.lost = list(range(first, first + slots[-1]))
        self.survivors = list(range(first))
        self.job = None
        self.ranks_gone_s = self.job_end_s = None
        self.mpiexec_hung = False
        self.strays = []

    @property
    def victim_name(self):
        return self.cluster.hosts[self.victim - 1].name

    def faults(self):
        """`{rank: (seconds after the fault, message)}` from FAULT lines."""
        out = {}
        for m in re.finditer(r"FAULT rank=(\d+) host=\S+ at=([\d.]+) iters=\d+ "
                             r"error=(.*)", self.job.output):
            out.setdefault(int(m.group(1)), (float(m.group(2)) - self.t0, m.group(3)))
        return out

    def names_lost(self, text, host_named=True):
        ranks = "|".join(map(str, self.lost))
        host = rf" \(host {re.escape(self.victim_name)}\)" if host_named else r"\b"
        return re.search(rf"rank ({ranks}){host}", text) is not None

    def describe(self):
        return (f"slots {self.slots}, ranks gone after {self.ranks_gone_s}, job "
                f"ended after {self.job_end_s}, strays {self.strays}: "
                f"{self.job.describe(6000)}")


def _wait(predicate, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def inject(slots, fault, launcher, env=None):
    """Runs the loop on a fresh cluster, injects `fault`; returns an Outcome."""
    hosts.require()
    with hosts.Cluster(len(slots)) as cluster:
        o = Outcome(cluster, slots)
        fault_dir = tempfile.mkdtemp(dir=cluster.workdir)
        argv = [sys.executable, SCRIPT, fault_dir]
        env = {**ENV, **(env or {})}
        done = {}

        def job():
            if launcher:
                cmd = [KDRUN, "-np", str(sum(slots)), "-H",
                       cluster.hosts_arg(slots, names=True), *argv]
                done["job"] = cluster.run(1, cmd, timeout=JOB_TIMEOUT, cwd=HERE,
                                          env={**env, **cluster.launcher_env()})
            else:
                done["job"] = cluster.mpirun(argv, slots, timeout=JOB_TIMEOUT,
                                             env=env, cwd=HERE, names=True)

        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        ready = os.path.join(fault_dir, "ready")
        if not _wait(lambda: os.path.exists(ready) or not thread.is_alive(), 120):
            cluster.kill_jobs()
        if not os.path.exists(ready):
            thread.join(JOB_TIMEOUT)
            pytest.fail(f"the loop never got going: {done['job'].describe()}")
        time.sleep(0.5)
        ranks = [sys.executable, SCRIPT]
        o.t0, start = time.time(), time.monotonic()
        if fault == "kill":
            pids = cluster.stray_pids(o.victim, ranks)
            assert len(pids) == slots[-1], pids
            res = cluster.run(o.victim, ["kill", "-9", *map(str, pids)], timeout=30)
        else:
            res = cluster.run(o.victim, ["ip", "link", "set", "eth0", "down"],
                              timeout=30)
        assert res.ok, res.describe()
        try:
            if _wait(lambda: not cluster.stray_pids(match=ranks), EXIT_BOUND_S, 0.2):
                o.ranks_gone_s = time.monotonic() - start
            if fault == "link" and not _wait(lambda: not thread.is_alive(), 15):
                # hydra waits for the cut-off host's proxy forever.
                o.mpiexec_hung = True
                cluster.kill_jobs()
            thread.join(JOB_TIMEOUT)
            o.job_end_s = time.monotonic() - start
            o.job = done["job"]
            # A few seconds for processes that are already on their way out.
            _wait(lambda: not cluster.stray_pids(), 10, 0.2)
            o.strays = [(p, " ".join(hosts._argv(p))[:200]) for p in cluster.stray_pids()]
        finally:
            cluster.kill_jobs()
            if fault == "link":
                cluster.run(o.victim, ["ip", "link", "set", "eth0", "up"], timeout=30)
        print(f"[{fault} {'kerasdist-run' if launcher else 'mpiexec'} {slots}] "
              f"faults {o.faults()}; ranks gone {o.ranks_gone_s}; job end "
              f"{o.job_end_s}; mpiexec hung {o.mpiexec_hung}")
        return o


def check_common(o):
    assert o.ranks_gone_s is not None, "rank processes outlived the bound: " + o.describe()
    assert not o.strays, "processes left on the hosts: " + o.describe()
    assert o.job.returncode not in (0, None), o.describe()


def check_survivor_errors(o, names):
    """Every surviving rank failed its collective within BOUND_S; with
    `names="host"` each error names a lost rank and its host."""
    faults = o.faults()
    assert sorted(r for r in faults if r in o.survivors) == o.survivors, o.describe()
    for r in o.survivors:
        seconds, message = faults[r]
        assert seconds <= BOUND_S, f"rank {r} failed after {seconds:.1f} s: {message}"
        assert names != "host" or o.names_lost(message), \
            f"rank {r}: {message!r} names no lost rank and its host"


# -- kill: every rank of the last host is SIGKILLed ---------------------------

@pytest.mark.parametrize("layout", ["2x2", "3x1"])
def test_killed_host_ranks_end_the_job_under_mpiexec(layout):
    # hydra sees its rank die by a signal and ends the job at once, before
    # the engine's bound; its banner names the host and the killed PID.
    o = inject({"2x2": [2, 2], "3x1": [1, 1, 1]}[layout], "kill", launcher=False)
    check_common(o)
    assert o.job_end_s <= BOUND_S, o.describe()
    assert re.search(rf"RUNNING AT {re.escape(o.victim_name)}\b", o.job.output), \
        o.describe()


def test_killed_host_ranks_end_the_job_under_kerasdist_run():
    o = inject([2, 2], "kill", launcher=True)
    check_common(o)
    assert o.job_end_s <= BOUND_S, o.describe()
    assert o.job.returncode == 128 + 9, o.describe()
    assert re.search(rf"kerasdist-run: error: rank ({'|'.join(map(str, o.lost))}) "
                     rf"\(host {re.escape(o.victim_name)}\) was killed by signal 9",
                     o.job.output), o.describe()


# -- link: the last host's eth0 goes down mid-loop ----------------------------

LINK_CASES = {  # name: (slots, under kerasdist-run, KERASDIST_HIERARCHICAL_ALLREDUCE)
    "mpiexec-2x2": ([2, 2], False, "auto"),
    "kerasdist-run-2x2-flat": ([2, 2], True, "0"),
    "kerasdist-run-3x1": ([1, 1, 1], True, "auto"),
}
_link_outcomes = {}


def link_cut(case):
    """The Outcome of one link-cut case, run once per module."""
    if case not in _link_outcomes:
        slots, launcher, hier = LINK_CASES[case]
        _link_outcomes[case] = inject(slots, "link", launcher,
                                      {"KERASDIST_HIERARCHICAL_ALLREDUCE": hier})
    return _link_outcomes[case]


@pytest.mark.parametrize("case", list(LINK_CASES))
def test_cut_link_survivors_fail_in_bound_and_nothing_is_left(case):
    o = link_cut(case)
    check_survivor_errors(o, names="none")
    # Some survivor blames a lost rank (the first to wait on one).
    assert any(o.names_lost(m, False) for _, m in o.faults().values()), o.describe()
    # Every rank, on every host (the cut one too), ends by itself.
    assert o.ranks_gone_s is not None and o.ranks_gone_s <= EXIT_BOUND_S, o.describe()
    assert not o.strays, o.describe()
    if LINK_CASES[case][1]:  # kerasdist-run ends the job too
        assert not o.mpiexec_hung and o.job_end_s <= EXIT_BOUND_S, o.describe()
        assert o.job.returncode not in (0, None), o.describe()


def test_cut_link_every_survivor_names_a_lost_rank_and_host():
    for case in LINK_CASES:
        check_survivor_errors(link_cut(case), names="host")


@pytest.mark.xfail(strict=True, reason="MPICH hydra: after a partition mpiexec waits "
                   "for the unreachable host's proxy forever, though every rank "
                   "has exited")
def test_cut_link_plain_mpiexec_ends_by_itself():
    o = link_cut("mpiexec-2x2")
    assert not o.mpiexec_hung, o.describe()


# -- hierarchical allreduce across hosts ---------------------------------------

@pytest.fixture(scope="module")
def cluster():
    hosts.require()
    with hosts.Cluster(2) as c:
        yield c


def run_suite(cluster, specs, env, timeout=240):
    result = cluster.mpirun([sys.executable, SUITE, *specs], [2, 2], timeout=timeout,
                            env={"KERASDIST_TIMEOUT_SECONDS": "30",
                                 "KERASDIST_INIT_TIMEOUT_SECONDS": "60", **env},
                            cwd=HERE)
    strays = cluster.stray_pids()
    cluster.kill_jobs()
    assert result.ok, f"{specs}: {result.describe()}"
    assert not strays, strays
    for spec in specs:
        path = spec.partition(":")[0]
        assert result.output.count(f"SUITE {path} done") == 4, result.output[-4000:]
    return result


def test_hierarchical_allreduce_is_exact_on_2x2(cluster):
    result = run_suite(cluster, ["multihost/topology.py", "mp/allreduce_sweep.py"],
                       {"KERASDIST_HIERARCHICAL_ALLREDUCE": "1"})
    assert result.output.count("hierarchical allreduce") >= 4, result.output[-4000:]


def test_hierarchical_sends_fewer_bytes_between_hosts(cluster):
    result = cluster.mpirun([sys.executable, os.path.join(HERE, "multihost",
                                                          "hier_bytes.py"), "0", "1"],
                            [2, 2], timeout=180, env=ENV, cwd=HERE)
    cluster.kill_jobs()
    assert result.ok and result.output.count("hier_bytes done") == 4, result.describe()
    tx = {(m.group(1), m.group(2)): int(m.group(3)) for m in re.finditer(
        r"HIERBYTES mode=(\d) host=(\S+) tx=(\d+)", result.output)}
    h2 = cluster.hosts[1].name
    flat, hier = tx[("0", h2)], tx[("1", h2)]
    print(f"host 2 sends per 64 MiB allreduce: flat {flat / MIB:.1f} MiB, "
          f"hierarchical {hier / MIB:.1f} MiB")
    # Flat ring: the link 3->0 carries 2(N-1)/N x 64 MiB = 96 MiB; hierarchical:
    # each local rank's 32 MiB chunk over a 2-host ring, 2 x 32 = 64 MiB.
    assert flat >= 1.5 * 64 * MIB, flat
    assert hier <= 0.85 * flat, (flat, hier)
