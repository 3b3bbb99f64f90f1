"""kerasdist across namespaced test hosts on one machine (`tests/hosts.py`).

Layouts are ranks per host, placed in blocks: `2x2` is two hosts with two
ranks each, `3x1` three hosts with one rank, `1x3` one host with three
ranks, `2+1` two ranks on host 1 and one on host 2. At most 4 ranks run at
once (this machine has 2 cores). Every job has a hard timeout; a hang is
killed and reported with its output. Tests skip where namespaces cannot be
made, unless CI=true.
"""

import json
import os
import subprocess
import sys

import pytest

import hosts

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS = {"2x2": [2, 2], "3x1": [1, 1, 1], "1x3": [3], "2+1": [2, 1]}
# Transfers fail after 30 s instead of the default 60 s; jobs get more.
ENV = {"KERASDIST_TIMEOUT_SECONDS": "30", "KERASDIST_INIT_TIMEOUT_SECONDS": "60"}


@pytest.fixture(scope="module")
def cluster():
    hosts.require()
    with hosts.Cluster(3) as c:
        yield c


def run_suite(cluster, specs, slots, timeout=240, env=None):
    """Runs rank scripts (paths relative to tests/) in one job; checks it."""
    result = cluster.mpirun(
        [sys.executable, os.path.join(HERE, "multihost", "suite.py"), *specs],
        slots=slots, timeout=timeout, env={**ENV, **(env or {})}, cwd=HERE)
    strays = cluster.stray_pids()
    cluster.kill_jobs()
    if not result.ok:
        pytest.fail(f"{specs} on slots {slots}: {result.describe()}")
    assert not strays, f"processes left on the hosts after the job: {strays}"
    total = sum(slots)
    for spec in specs:
        path = spec.partition(":")[0]
        done = result.output.count(f"SUITE {path} done")
        assert done == total, f"{path} finished on {done} of {total} ranks:\n" \
                              f"{result.output[-6000:]}"
    return result


def expected_topology(slots):
    """What every rank should report for a block layout."""
    host_of = [h for h, n in enumerate(slots) for _ in range(n)]
    size = len(host_of)
    want = []
    for r in range(size):
        h = host_of[r]
        local_rank = r - host_of.index(h)
        peers = [k for k in range(size)
                 if k - host_of.index(host_of[k]) == local_rank]
        right, left = (r + 1) % size, (r - 1) % size
        want.append({
            "rank": r, "size": size, "host": h,
            "local_rank": local_rank, "local_size": slots[h],
            "cross_rank": peers.index(r), "cross_size": len(peers),
            "shm_to": size > 1 and host_of[right] == h,
            "shm_from": size > 1 and host_of[left] == h,
            "right": right, "left": left,
        })
    return want


# -- the harness itself -----------------------------------------------------

def test_hosts_have_own_names_addresses_and_private_shm(cluster):
    marker = f"kd-marker-{os.getpid()}"
    out = cluster.run(1, ["sh", "-c", f"touch /dev/shm/{marker} && hostname && "
                                      "ip -4 -o addr show && ip route"], timeout=30)
    assert out.ok, out.describe()
    lines = out.output.splitlines()
    assert lines[0] == cluster.hosts[0].name
    assert f"{cluster.hosts[0].address}/24" in out.output
    assert "default" not in out.output  # nothing is routed out
    for h in cluster.hosts[1:]:
        other = cluster.run(h.index, ["sh", "-c", "hostname; ls /dev/shm"], timeout=30)
        assert other.ok, other.describe()
        assert other.output.splitlines()[0] == h.name
        assert marker not in other.output
    assert not os.path.exists(f"/dev/shm/{marker}")
    # Host 1 reaches host 3 over the bridge.
    probe = ("import socket; s = socket.create_connection(('%s', 9), timeout=5)"
             % cluster.hosts[2].address)
    listen = subprocess.Popen(
        cluster.hosts[2].enter_argv() + [sys.executable, "-c",
                                         "import socket; s = socket.socket(); "
                                         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                                         "s.bind(('0.0.0.0', 9)); s.listen(); "
                                         "print('up', flush=True); s.accept()"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert listen.stdout.readline().strip() == "up"
        conn = cluster.run(1, [sys.executable, "-c", probe], timeout=30)
        assert conn.ok, conn.describe()
        listen.wait(timeout=30)
    finally:
        listen.kill()
        listen.wait()


def test_hung_job_is_killed_reported_and_cleaned_up():
    hosts.require()
    with hosts.Cluster(2) as c:
        names = c.namespaces()
        code = "import socket, time; print('started on', socket.gethostname(), " \
               "flush=True); time.sleep(600)"
        result = c.mpirun([sys.executable, "-c", code], slots=[1, 1], timeout=8)
        assert result.timed_out and not result.ok
        for h in c.hosts:
            assert f"started on {h.name}" in result.output, result.output
        assert "timed out" in result.describe()
        assert c.stray_pids() == []
        with pytest.raises(hosts.JobFailed, match="exited with 3"):
            c.mpirun([sys.executable, "-c", "raise SystemExit(3)"], slots=[1, 1],
                     timeout=60, check=True)
        workdir = c.workdir
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    assert not any(n in listing for n in names), listing
    assert not os.path.exists(workdir)


def test_cleanup_on_error_inside_the_context():
    hosts.require()
    with pytest.raises(ZeroDivisionError):
        with hosts.Cluster(2) as c:
            names = c.namespaces()
            holders = [h.pid for h in c.hosts]
            1 / 0
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    assert not any(n in listing for n in names), listing
    assert not any(os.path.exists(f"/proc/{p}/ns") for p in holders)


def test_inter_host_mpi_bytes_cross_the_links(cluster):
    # Without a boot id and IPC namespace per host, UCX would take the ranks
    # for one machine and move these bytes through shared memory instead.
    before = cluster.link_bytes(2)
    result = cluster.mpirun([sys.executable, os.path.join(HERE, "multihost",
                                                          "mpi_allreduce.py"), "16"],
                            slots=[1, 1], timeout=120, cwd=HERE)
    assert result.ok and result.output.count("MPI allreduce ok") == 2, result.describe()
    after = cluster.link_bytes(2)
    mib = 1 << 20
    # Host 2 must at least receive host 1's 16 MiB, and send its own.
    assert after[0] - before[0] >= 16 * mib, (before, after)
    assert after[1] - before[1] >= 16 * mib, (before, after)


def test_shaping_installs_tbf_on_both_ends(cluster):
    cluster.shape("2gbit")
    try:
        out = cluster.run(2, ["tc", "qdisc", "show", "dev", "eth0"], timeout=30)
        assert out.ok and "tbf" in out.output and "2Gbit" in out.output, out.output
    finally:
        cluster.unshape()
    out = cluster.run(2, ["tc", "qdisc", "show", "dev", "eth0"], timeout=30)
    assert "tbf" not in out.output, out.output


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception),
                                         ("", pytest.skip.Exception)])
def test_unavailable_hosts_skip_except_under_ci(monkeypatch, ci, outcome):
    monkeypatch.setattr(hosts, "_probe_result", ["`ip` is not installed"])
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="`ip` is not installed"):
        hosts.require()


# -- kerasdist on the hosts -------------------------------------------------

@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_topology_sweep_collectives_and_join(cluster, layout):
    """Ranks, hosts and shared-memory links are right; every collective is
    exact (the existing sweep and collectives scripts, run on the hosts)."""
    slots = LAYOUTS[layout]
    result = run_suite(cluster, ["multihost/topology.py", "mp/allreduce_sweep.py",
                                 "mp/collectives.py", "mp/join.py"], slots)
    records = sorted((json.loads(line[5:]) for line in result.output.splitlines()
                      if line.startswith("TOPO ")), key=lambda d: d["rank"])
    want = expected_topology(slots)
    assert [d["rank"] for d in records] == list(range(len(want))), result.output[-4000:]
    for got, exp in zip(records, want):
        name = cluster.hosts[exp["host"]].name
        where = f"rank {exp['rank']} on {layout}: {got}"
        for key in ("size", "local_rank", "local_size", "cross_rank", "cross_size"):
            assert got[key] == exp[key], f"{key}: want {exp[key]}; {where}"
        assert got["hostname"] == name and got["processor"] == name, where
        assert got["hosts_seen"] == [cluster.hosts[w["host"]].name for w in want], where
        info = got["transport"]
        assert info.startswith("mpi("), where
        assert (f"to rank {exp['right']}" in info) == exp["shm_to"], where
        assert (f"from rank {exp['left']}" in info) == exp["shm_from"], where
        # No spin by default once the ranks span hosts (EngineConfig::spin_us).
        one_host = len({w["host"] for w in want}) == 1
        assert got["spin_us"] == (30 if one_host else 0), where


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fit_with_callbacks_ends_with_bit_identical_replicas(cluster, layout):
    result = run_suite(cluster, ["multihost/fit.py"], LAYOUTS[layout])
    assert result.output.count("fit replicas identical") == sum(LAYOUTS[layout])


def test_64mib_allreduce_across_2x2_is_exact(cluster):
    # Mixed shared-memory / MPI ring on 2 hosts x 2 ranks; this size once
    # stalled (see ARCHITECTURE.md, 2026-12-03). 64 MiB first, then smaller.
    before = cluster.link_bytes(2)
    # The flat ring, which this is about (the hierarchical allreduce, the
    # default on 2x2, sends 1.0 x per host and is tested on its own).
    result = run_suite(cluster, ["multihost/big_allreduce.py:64,16,1"], [2, 2],
                       timeout=180, env={"KERASDIST_HIERARCHICAL_ALLREDUCE": "0"})
    assert result.output.count("BIG 64 ") == 2 * 4
    # The ring 0->1->2->3->0 crosses into host 2 on the link 1->2, which
    # carries 2(N-1)/N of each buffer: 1.5 x (64 + 16 + 1) MiB, twice.
    received = cluster.link_bytes(2)[0] - before[0]
    assert received >= 2 * 1.5 * 81 * (1 << 20), received


def test_allreduce_exact_over_shaped_links(cluster):
    cluster.shape("1gbit")
    try:
        result = run_suite(cluster, ["multihost/big_allreduce.py:4"], [2, 1],
                           timeout=180)
    finally:
        cluster.unshape()
    assert result.output.count("BIG 4 ") == 2 * 3
