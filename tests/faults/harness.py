"""Runs one fault-injection case of tests/faults/rank.py and observes it.

A case is (point, signal, victim, np, launcher). The launcher is
`kerasdist-run` ("kdrun") or this environment's plain `mpiexec`. The job
runs in a private mount namespace with its own tmpfs on /dev/shm (when we
are root and `unshare` works), so the kerasdist segments it leaves behind
are its own and nobody else's; the wrapper lists that /dev/shm once the
launcher has exited.

The harness watches the pid files the ranks write, takes the fault time
from the victim's `fault` record, and notes when each survivor's process
disappears. It never waits more than `hang_bound` seconds after the fault:
then it records who is still alive, and (like at the end of every case)
kills the stopped victim and anything left of the job.
"""

import dataclasses
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import blame  # noqa: E402  (tests/blame.py)

RANK_SCRIPT = os.path.join(HERE, "rank.py")
BIN = os.path.dirname(sys.executable)
ENV = {"KERASDIST_TIMEOUT_SECONDS": "5", "KERASDIST_INIT_TIMEOUT_SECONDS": "10",
       "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
       "PYTHONDONTWRITEBYTECODE": "1"}
# The wrapper: private /dev/shm, run the launcher, list what is left there.
_WRAP = ('mount -t tmpfs -o size=1g kerasdist-faults /dev/shm || exit 97; '
         '"$@"; rc=$?; ls -A /dev/shm > "$0/shm.after"; exit $rc')


@dataclasses.dataclass(frozen=True)
class Case:
    point: str
    signal: str  # "KILL" or "STOP"
    victim: str  # "0" or "last"
    np: int
    launcher: str  # "kdrun" or "mpiexec"

    @property
    def id(self):
        return f"{self.point}-{self.signal}-r{self.victim}-np{self.np}-{self.launcher}"

    @property
    def victim_rank(self):
        return 0 if self.victim == "0" else self.np - 1


@dataclasses.dataclass
class Result:
    case: Case
    fault: dict = None  # the victim's record
    exits: dict = dataclasses.field(default_factory=dict)  # rank -> s after fault
    results: dict = dataclasses.field(default_factory=dict)  # rank -> record
    alive_at_bound: list = dataclasses.field(default_factory=list)  # ranks
    launcher_rc: int = None
    launcher_exit: float = None  # s after fault, before our own cleanup
    left_by_launcher: list = dataclasses.field(default_factory=list)  # pids
    left_after_cleanup: list = dataclasses.field(default_factory=list)
    victim_state: str = None  # seen after the fault: "T" = stopped
    shm_left: list = None  # None: not checked
    output: str = ""
    error: str = None  # the harness could not run the case
    earlier: list = dataclasses.field(default_factory=list)  # runs that missed

    @property
    def last_exit(self):
        return max(self.exits.values()) if self.exits else None

    def survivor_messages(self):
        return {r: rec.get("message", "") for r, rec in sorted(self.results.items())}

    def launcher_lines(self):
        return [line for line in self.output.splitlines()
                if line.startswith("kerasdist-run:")]

    def summary(self):
        fields = dataclasses.asdict(self)
        fields["case"] = self.case.id
        fields["output"] = self.output[-3000:]
        fields["earlier"] = [f"missed: {landed(r)}" for r in self.earlier]
        return json.dumps(fields, indent=1, default=str)


def landed(res):
    """None if the survivors' errors show the fault where the case means it,
    else what they show instead.

    Only SIGSTOP cases tell: a killed rank ends the job at once. mid_ring
    means a survivor was inside the ring's transfers (not negotiating the
    next allreduce); coordinator_blocked, that rank 0 was blocked in an
    alltoall transfer on the victim while rank 1 heard nothing from it;
    negotiation and in_init, that nobody was in a transfer.
    """
    c = res.case
    if c.signal != "STOP" or not res.results:
        return None
    msgs = {r: rec.get("message", "") for r, rec in res.results.items() if not rec["ok"]}
    states = {r: blame.state(m) for r, m in msgs.items()}
    if c.point == "mid_ring":
        ok = any((blame.transfer(m) or ())[2:] == ("allreduce", "big") for m in msgs.values())
    elif c.point == "coordinator_blocked":
        ok = ((blame.transfer(msgs.get(0, "")) or ())[1:] == (c.victim_rank, "alltoall", "a2a")
              and states.get(1) == "silent coordinator")
    elif c.point == "negotiation":
        ok = all(s in ("silent coordinator", "silent worker") for s in states.values())
    elif c.point == "in_init":
        ok = all(s == "init" for s in states.values())
    else:
        return None
    return None if ok else f"survivors' states {states}"


def _proc_state(pid):
    """The /proc state letter of `pid`, or None if it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in ("Z", "X") else state


def _pgrep(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _can_isolate_shm():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         "mount -t tmpfs probe /dev/shm && ls -A /dev/shm"],
        capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip() == ""


_ISOLATE = None


def command(case, case_dir):
    args = [sys.executable, RANK_SCRIPT, case.point, case.signal, case.victim, case_dir]
    if case.launcher == "kdrun":
        argv = [os.path.join(BIN, "kerasdist-run"), "-np", str(case.np), *args]
    else:
        argv = [os.path.join(BIN, "mpiexec"), "-n", str(case.np), *args]
    global _ISOLATE
    if _ISOLATE is None:
        _ISOLATE = _can_isolate_shm()
    if _ISOLATE:
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", _WRAP,
                case_dir, *argv]
    return argv


def run_case(case, hang_bound=30.0, start_bound=150.0, poll=0.02):
    """Runs `case`; returns a Result. Leaves no process behind."""
    case_dir = tempfile.mkdtemp(prefix=f"kdfault-{case.id}-")
    res = Result(case)
    out_path = os.path.join(case_dir, "output.txt")
    env = {**os.environ, **ENV}
    started = time.monotonic()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(command(case, case_dir), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    pids = {}
    try:
        _observe(case, case_dir, proc, res, pids, started, hang_bound,
                 start_bound, poll)
    finally:
        _cleanup(case_dir, proc, res, pids)
        with open(out_path, errors="replace") as f:
            res.output = f.read()
        after = os.path.join(case_dir, "shm.after")
        if os.path.exists(after):
            with open(after) as f:
                res.shm_left = [n for n in f.read().split() if n.startswith("kerasdist-")]
        shutil.rmtree(case_dir, ignore_errors=True)
    return res


def _load_pids(case, case_dir, pids):
    for rank in range(case.np):
        if rank not in pids:
            rec = _read(os.path.join(case_dir, f"pid.{rank}"))
            if rec:
                pids[rank] = rec


def _observe(case, case_dir, proc, res, pids, started, hang_bound, start_bound, poll):
    victim = case.victim_rank
    survivors = [r for r in range(case.np) if r != victim]
    t_fault = None
    while True:
        now = time.monotonic()
        _load_pids(case, case_dir, pids)
        if t_fault is None:
            res.fault = _read(os.path.join(case_dir, "fault"))
            if res.fault:
                t_fault = res.fault["t"]
            elif proc.poll() is not None or now - started > start_bound:
                res.error = (f"no fault within {now - started:.0f} s (launcher "
                             f"status {proc.poll()})")
                for r in range(case.np):  # Why: what the ranks reported.
                    rec = _read(os.path.join(case_dir, f"result.{r}"))
                    if rec:
                        res.results[r] = rec
                return
            else:
                time.sleep(poll)
                continue
        if res.victim_state is None and victim in pids:
            want = "T" if case.signal == "STOP" else None
            limit = time.monotonic() + 3.0  # A killed TF process takes a while.
            while (_proc_state(pids[victim]["pid"]) != want
                   and time.monotonic() < limit):
                time.sleep(poll)
            res.victim_state = _proc_state(pids[victim]["pid"]) or "gone"
        for r in survivors:
            if r in res.exits or r not in pids:
                continue
            if _proc_state(pids[r]["pid"]) is None:
                res.exits[r] = round(time.monotonic() - t_fault, 2)
        if len(res.exits) == len(survivors):
            break
        if time.monotonic() - t_fault > hang_bound:
            res.alive_at_bound = [r for r in survivors if r not in res.exits]
            break
        time.sleep(poll)
    for r in survivors:
        rec = _read(os.path.join(case_dir, f"result.{r}"))
        if rec:
            rec["t"] = round(rec["t"] - t_fault, 2)
            res.results[r] = rec
    # Give the launcher a moment to end the job on its own (kerasdist-run
    # must stop a stopped victim; plain mpiexec waits for it forever).
    deadline = time.monotonic() + 8.0
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(poll)
    if proc.poll() is not None:
        res.launcher_exit = round(time.monotonic() - t_fault, 2)
    res.left_by_launcher = sorted(
        {p for rec in pids.values() for p in (rec["pid"], rec["ppid"])
         if _proc_state(p) is not None and p != os.getpid()} | set(_pgrep(case_dir)))


def _cleanup(case_dir, proc, res, pids):
    """Kills whatever is left of the job (the stopped victim first)."""
    for rec in pids.values():
        for pid in (rec["pid"], rec["ppid"]):
            if _proc_state(pid) is not None and pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    for pid in _pgrep(case_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        res.launcher_rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        res.launcher_rc = proc.wait()
    time.sleep(0.2)
    res.left_after_cleanup = _pgrep(case_dir)
    for pid in res.left_after_cleanup:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_until_landed(case, attempts=3, **kw):
    """Runs `case` until its fault lands where the case means it (landed()),
    at most `attempts` times. Returns the last Result; the runs before it,
    which missed, are in its `earlier` (they are checked all the same)."""
    earlier = []
    for _ in range(attempts):
        res = run_case(case, **kw)
        if res.error or landed(res) is None or len(earlier) == attempts - 1:
            break
        earlier.append(res)
    res.earlier = earlier
    return res


def run_cases(cases, workers=3, **kw):
    """Runs `cases`, `workers` at a time; returns {case.id: Result}."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda c: run_until_landed(c, **kw), cases))
    return {r.case.id: r for r in results}


def excerpt(res, width=90):
    msgs = [m for m in res.survivor_messages().values() if m]
    text = msgs[0] if msgs else (res.launcher_lines() or [""])[0]
    text = " ".join(text.split())
    text = re.sub(r"^\{\{function_node [^}]*\}\} ", "", text)
    text = re.sub(r" \[Op:\w+\].*$", "", text)
    return text if len(text) <= width else text[:width - 3] + "..."


def table(results):
    """A markdown table of Results: case x np -> exit time, message."""
    rows = ["| case | np | launcher | fault->last survivor exit (s) | "
            "launcher exit (s) | left behind | /dev/shm | message excerpt |",
            "|---|---|---|---|---|---|---|---|"]
    for res in sorted(results, key=lambda r: (r.case.point, r.case.signal,
                                              r.case.victim, r.case.np,
                                              r.case.launcher)):
        c = res.case
        if res.error:
            exit_s = f"ERROR: {res.error}"
        elif res.alive_at_bound:
            exit_s = f"HANG (ranks {res.alive_at_bound} alive)"
        else:
            exit_s = f"{res.last_exit:.1f}" if res.last_exit is not None else "-"
        if res.earlier:
            exit_s += f" (run {len(res.earlier) + 1}x: the fault missed before)"
        left = res.left_by_launcher if c.launcher == "kdrun" else res.left_after_cleanup
        shm = "-" if res.shm_left is None else (", ".join(res.shm_left) or "clean")
        name = f"{c.point} {c.signal} rank {c.victim}"
        launch = "-" if res.launcher_exit is None else f"{res.launcher_exit:.1f}"
        rows.append(f"| {name} | {c.np} | {c.launcher} | {exit_s} | {launch} | "
                    f"{len(left) or 'none'} | {shm} | "
                    f"{excerpt(res).replace('|', '/')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python harness.py point signal victim np launcher
    p, s, v, n, l = sys.argv[1:6]
    r = run_case(Case(p, s, v, int(n), l))
    print(r.summary())
    print(table([r]))
