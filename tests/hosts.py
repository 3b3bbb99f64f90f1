"""Test hosts on one machine: namespaces that MPI sees as separate hosts.

Each host gets its own network namespace (a veth into a bridge that lives in
a namespace of its own), its own hostname (UTS namespace), a private, fresh
`/dev/shm` (mount namespace), its own IPC namespace and boot id (else UCX
takes all hosts for one machine and moves their bytes through shared
memory), and an `/etc/hosts` naming all hosts. A holder process (`sleep`)
keeps each host's namespaces alive; everything that runs on a host enters
them with `nsenter`. MPICH's hydra starts the ranks through `-launcher ssh
-launcher-exec tests/multihost/hydra_ssh.sh`: that script drops ssh-style
options, takes the host argument and runs the rest inside that host's
namespaces instead of logging in. `mpiexec` itself runs on host 1.

Addresses come from one private /24 that exists only inside the namespaces
made here; nothing is connected to the caller's namespace, so nothing is
routed out. Names carry the creating process id and a sequence number, so
concurrent runs do not collide, and `Cluster.close()` (also called on
errors, by the context manager) kills every process left in the namespaces
and deletes them.

Example:

```python
with hosts.Cluster(2) as cluster:
    result = cluster.mpirun([sys.executable, "script.py"], slots=[2, 2])
    print(result.output)
```

Requires root, `ip`, `unshare` and `nsenter`. Use `unavailable_reason()` to
decide whether to skip, and `require()` in pytest to skip (or fail with
`CI=true`). From `benchmarks/`, put `tests/` on `sys.path` and `import hosts`.
"""

import itertools
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost",
                        "hydra_ssh.sh")
SUBNET = "10.250.71"  # only ever configured inside the namespaces made here
PREFIX = "kdt"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)x(\d+)-(br|h\d+)$")
_SEQ = itertools.count()
_NOISE = re.compile(r"UCX +WARN|oneDNN custom operations|absl::InitializeLog|"
                    r"^\s*$")
_COMMAND_TIMEOUT = 30.0
_KILL_GRACE = 5.0


class HostsUnavailable(RuntimeError):
    """Raised when namespaced test hosts cannot be made here."""


class JobFailed(AssertionError):
    """Raised by `Cluster.mpirun(check=True)` for a failed or hung job."""


class JobResult:
    """What a job on the cluster did.

    Attributes:
        argv: The full command that was run (on host 1).
        returncode: The exit status, or `None` if the job timed out.
        output: stdout and stderr, merged.
        timed_out: Whether the job hung and was killed.
        seconds: Wall time of the job.
    """

    def __init__(self, argv, returncode, output, timed_out, seconds):
        self.argv, self.returncode, self.output = argv, returncode, output
        self.timed_out, self.seconds = timed_out, seconds

    @property
    def ok(self):
        return not self.timed_out and self.returncode == 0

    def describe(self, tail=8000):
        """A summary for failure messages: the state and the output's end,
        without the lines of TensorFlow's and UCX's start-up and exit noise."""
        state = (f"timed out after {self.seconds:.0f} s (a hang) and was killed"
                 if self.timed_out else f"exited with {self.returncode}")
        lines = [line for line in self.output.splitlines()
                 if not _NOISE.search(line)]
        return f"Job {state}. Output:\n" + "\n".join(lines)[-tail:]


def _run(argv, timeout=_COMMAND_TIMEOUT, check=True):
    """Runs a setup command with a timeout; raises with its output."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{shlex.join(argv)} timed out after {timeout} s") from e
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): "
                           f"{proc.stdout.strip()}")
    return proc


def _tool(name):
    path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if path is None:
        raise HostsUnavailable(f"`{name}` is not installed")
    return path


def _netns_pids(ns):
    proc = _run([_tool("ip"), "netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _alive(pid):
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _kill_all(pids, grace=_KILL_GRACE):
    """SIGTERM, then SIGKILL whatever is still there after `grace` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return


def _delete_namespaces(names):
    """Kills every process in the named namespaces and deletes them."""
    ip = _tool("ip")
    for ns in names:
        _kill_all(_netns_pids(ns))
    for ns in names:
        _run([ip, "netns", "delete", ns], check=False)


def cleanup_stale():
    """Deletes namespaces left by harness runs whose process is gone.

    Returns:
        The names of the namespaces deleted.
    """
    listing = _run([_tool("ip"), "netns", "list"], check=False).stdout
    stale = []
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME_RE.match(name)
        if m and not _alive(int(m.group(1))):
            stale.append(name)
    _delete_namespaces(stale)
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        m = re.match(rf"^{PREFIX}(\d+)x\d+-", entry)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
    return stale


def _parse_rate_bits(rate):
    units = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", str(rate).lower())
    if not m:
        raise ValueError("Invalid value for argument `rate`. Expected e.g. "
                         f"'1gbit' or '100mbit'. Received: rate={rate!r}")
    return float(m.group(1)) * units[m.group(2)]


class Host:
    """One test host.

    Attributes:
        index: 1-based position in the cluster.
        name: Its hostname (and its namespace's name).
        address: Its IPv4 address on the cluster's bridge.
        pid: The holder process whose namespaces are the host's.
    """

    def __init__(self, index, name, address):
        self.index, self.name, self.address = index, name, address
        self.pid = self.holder = None

    def enter_argv(self, cwd=None):
        """The argv prefix that runs a command inside this host."""
        argv = [_tool("nsenter"), "-t", str(self.pid), "-n", "-u", "-i", "-m"]
        if cwd:
            argv.append(f"--wd={cwd}")
        return argv + ["--"]

    def __repr__(self):
        return f"Host({self.name!r}, {self.address!r})"


class Cluster:
    """N namespaced test hosts on this machine, and MPI jobs across them.

    Args:
        num_hosts: How many hosts to make (1 to 200).
        rate: Optional bandwidth limit for every host's link, e.g. `"1gbit"`,
            applied with `tc ... tbf` in both directions. Defaults to `None`
            (unshaped).
        shm_size: Size of each host's private `/dev/shm`. Defaults to `"2g"`.
        workdir: Where to put the host map, hosts file and boot ids. Defaults to
            a fresh temporary directory, removed on close.

    Raises:
        HostsUnavailable: If namespaces cannot be made here (not root, a tool
            missing, permission denied).
    """

    def __init__(self, num_hosts, rate=None, shm_size="2g", workdir=None):
        if not 1 <= int(num_hosts) <= 200:
            raise ValueError("Invalid value for argument `num_hosts`. Expected "
                             f"1 to 200. Received: num_hosts={num_hosts!r}")
        _check_prerequisites()
        self._owner = os.getpid()  # a forked child must not tear it down
        self.token = f"{PREFIX}{self._owner}x{next(_SEQ)}"
        self.bridge_ns = f"{self.token}-br"
        self.hosts = [Host(i, f"{self.token}-h{i}", f"{SUBNET}.{i}")
                      for i in range(1, int(num_hosts) + 1)]
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"{self.token}-")
        self.launcher = LAUNCHER
        self.host_map = os.path.join(self.workdir, "hosts.map")
        self._created = []
        self._closed = False
        try:
            cleanup_stale()
            self._build(shm_size)
            if rate is not None:
                self.shape(rate)
        except BaseException as e:
            self.close()
            if isinstance(e, RuntimeError) and (
                    "Operation not permitted" in str(e) or "Permission denied" in str(e)):
                raise HostsUnavailable(f"cannot make namespaces here: {e}") from e
            raise

    # -- construction -------------------------------------------------------

    def _ip(self, *args):
        return _run([_tool("ip"), *args])

    def _build(self, shm_size):
        self._ip("netns", "add", self.bridge_ns)
        self._created.append(self.bridge_ns)
        self._ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        hosts_file = os.path.join(self.workdir, "hosts")
        with open(hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.writelines(f"{h.address} {h.name}\n" for h in self.hosts)
        for h in self.hosts:
            self._ip("netns", "add", h.name)
            self._created.append(h.name)
            port = f"v{h.index}"
            # Both ends are made directly in the namespaces: nothing ever
            # appears in the caller's namespace.
            self._ip("-n", self.bridge_ns, "link", "add", port, "type", "veth",
                     "peer", "name", "eth0", "netns", h.name)
            self._ip("-n", self.bridge_ns, "link", "set", port, "master", "br0", "up")
            self._ip("-n", h.name, "link", "set", "lo", "up")
            self._ip("-n", h.name, "addr", "add", f"{h.address}/24", "dev", "eth0")
            self._ip("-n", h.name, "link", "set", "eth0", "up")
            self._start_holder(h, shm_size, hosts_file)
        self._write_host_map()

    def _start_holder(self, host, shm_size, hosts_file):
        # A boot id of its own: UCX treats processes with one boot id (and
        # IPC namespace) as one machine and would move "inter-host" bytes
        # through shared memory or CMA instead of over the veth.
        boot_id = os.path.join(self.workdir, f"boot_id.h{host.index}")
        with open(boot_id, "w") as f:
            f.write(f"{uuid.uuid4()}\n")
        script = (f"hostname {shlex.quote(host.name)} && "
                  f"mount -t tmpfs -o size={shlex.quote(shm_size)},mode=1777 "
                  f"kdshm /dev/shm && "
                  f"mount --bind {shlex.quote(hosts_file)} /etc/hosts && "
                  f"mount --bind {shlex.quote(boot_id)} /proc/sys/kernel/random/boot_id && "
                  "echo ready && exec sleep infinity")
        argv = [_tool("ip"), "netns", "exec", host.name, _tool("unshare"),
                "--uts", "--ipc", "--mount", "--propagation", "private",
                "sh", "-c", script]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        host.holder, host.pid = proc, proc.pid
        ready, _, _ = select.select([proc.stdout], [], [], _COMMAND_TIMEOUT)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            rest = proc.stdout.read() if proc.poll() is not None else ""
            raise RuntimeError(f"host {host.name} did not start: {line}{rest}".strip())

    def _write_host_map(self):
        with open(self.host_map, "w") as f:
            f.writelines(f"{h.address} {h.name} {h.pid}\n" for h in self.hosts)

    # -- use ----------------------------------------------------------------

    def shape(self, rate, burst=None, latency="50ms"):
        """Limits every host link to `rate` in both directions (`tc tbf`).

        Args:
            rate: A tc rate such as `"1gbit"` or `"200mbit"`.
            burst: Bucket size in bytes; defaults to 10 ms at `rate`, at
                least 64 KiB.
            latency: The longest a packet may wait in the bucket.
        """
        burst = int(burst or max(64 * 1024, _parse_rate_bits(rate) / 8 / 100))
        self._tc("replace", "tbf", "rate", str(rate), "burst", str(burst),
                 "latency", latency)

    def unshape(self):
        """Removes the bandwidth limits set by `shape()`."""
        self._tc("del", check=False)

    def _tc(self, verb, *qdisc, check=True):
        # Both ends of each host's veth: egress of the host and towards it.
        for h in self.hosts:
            for ns, dev in ((h.name, "eth0"), (self.bridge_ns, f"v{h.index}")):
                _run([_tool("ip"), "netns", "exec", ns, _tool("tc"), "qdisc", verb,
                      "dev", dev, "root", *qdisc], check=check)

    def run(self, host, argv, timeout=60, env=None, cwd=None):
        """Runs one command on a host (1-based index) and waits for it.

        Returns:
            A `JobResult`; the command is killed if it outlives `timeout`.
        """
        h = self.hosts[host - 1]
        return self._wait(h.enter_argv(cwd or os.getcwd()) + [str(a) for a in argv],
                          timeout, env)

    def link_bytes(self, host):
        """Bytes received and sent so far by a host's link (1-based index).

        Returns:
            A `(rx_bytes, tx_bytes)` tuple, counted on the host's `eth0`.
        """
        out = _run([_tool("ip"), "-n", self.hosts[host - 1].name, "-j", "-s",
                    "link", "show", "dev", "eth0"]).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def hosts_arg(self, slots, names=False):
        """The `-hosts` value for `slots[i]` ranks on host i+1 (0 = unused),
        with host names instead of addresses if `names`."""
        if len(slots) > len(self.hosts):
            raise ValueError(f"{len(slots)} slot counts for {len(self.hosts)} hosts")
        return ",".join(f"{h.name if names else h.address}:{n}"
                        for h, n in zip(self.hosts, slots) if n)

    def launcher_env(self):
        """Variables that make a hydra `mpiexec` run on a host (e.g. under
        `kerasdist-run`) start remote ranks through the host map."""
        return {"HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": self.launcher,
                "KD_TEST_HOSTS_MAP": self.host_map}

    def mpirun(self, argv, slots, timeout=120, env=None, check=False, cwd=None,
               mpiexec=None, extra_args=(), names=False):
        """Runs an MPI job across the hosts with the environment's mpiexec.

        Ranks are placed in blocks: the first `slots[0]` ranks on host 1, the
        next `slots[1]` on host 2, and so on.

        Args:
            argv: The program and its arguments, run on every rank.
            slots: Ranks per host, e.g. `[2, 1]` for 2 on host 1, 1 on host 2.
            timeout: Seconds before the job counts as hung and is killed.
            env: Extra environment variables for the ranks.
            check: Raise `JobFailed` unless the job exits with 0.
            cwd: Working directory of the ranks. Defaults to the current one.
            mpiexec: The mpiexec to use. Defaults to the one next to
                `sys.executable`.
            extra_args: More mpiexec options, placed before the program.
            names: Give hydra host names, not addresses (its messages then
                name the hosts).

        Returns:
            A `JobResult`.
        """
        slots = [int(n) for n in slots]
        total = sum(slots)
        if total < 1:
            raise ValueError(f"Invalid value for argument `slots`: {slots!r}")
        launcher_host = next(i for i, n in enumerate(slots) if n)
        mpiexec = mpiexec or mpiexec_path()
        cmd = [mpiexec, "-launcher", "ssh", "-launcher-exec", self.launcher,
               "-hosts", self.hosts_arg(slots, names), "-n", str(total), *extra_args,
               *[str(a) for a in argv]]
        # mpiexec runs on the first host with ranks (host 1 in every layout
        # the tests use), so that host's ranks are local to it.
        full = self.hosts[launcher_host].enter_argv(cwd or os.getcwd()) + cmd
        result = self._wait(full, timeout, {"KD_TEST_HOSTS_MAP": self.host_map,
                                            **(env or {})})
        if check and not result.ok:
            raise JobFailed(f"{shlex.join(cmd)} on slots {slots}: {result.describe()}")
        return result

    def _wait(self, argv, timeout, env):
        full_env = dict(os.environ)
        full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update({k: str(v) for k, v in (env or {}).items()})
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=full_env,
                                start_new_session=True)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGTERM first: hydra forwards it to the ranks. Then kill whatever
            # is left on the hosts (ranks run in sessions of their own).
            proc.terminate()
            try:
                out, _ = proc.communicate(timeout=_KILL_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate(timeout=_KILL_GRACE)
            self.kill_jobs()
        return JobResult(argv, None if timed_out else proc.returncode, out or "",
                         timed_out, time.monotonic() - start)

    def stray_pids(self, host=None, match=None):
        """Processes on the hosts (or on one, 1-based) other than the holders
        (none between jobs); with `match` (a list), those whose argv starts so."""
        holders = {h.pid for h in self.hosts}
        found = [p for h in self.hosts if host in (None, h.index)
                 for p in _netns_pids(h.name) if p not in holders and _alive(p)]
        return [p for p in found if match is None or _argv(p)[:len(match)] == list(match)]

    def kill_jobs(self):
        """Kills every process on the hosts except the holders."""
        _kill_all(self.stray_pids())

    def namespaces(self):
        """The names of the namespaces this cluster made (and still has)."""
        return list(self._created)

    # -- teardown -----------------------------------------------------------

    def close(self):
        """Kills everything on the hosts and deletes all it created."""
        if self._closed or os.getpid() != getattr(self, "_owner", None):
            return
        self._closed = True
        try:
            _delete_namespaces(list(reversed(self._created)))
            for h in self.hosts:
                if h.holder is not None:
                    try:
                        h.holder.wait(timeout=_KILL_GRACE)
                    except subprocess.TimeoutExpired:
                        pass
                    h.holder.stdout.close()
        finally:
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def mpiexec_path():
    """The mpiexec that belongs to the running Python environment."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else "mpiexec"


def _check_prerequisites():
    if sys.platform != "linux":
        raise HostsUnavailable("namespaced test hosts need Linux")
    if os.geteuid() != 0:
        raise HostsUnavailable("namespaced test hosts need root (euid is "
                               f"{os.geteuid()})")
    for tool in ("ip", "unshare", "nsenter", "mount", "hostname", "awk"):
        _tool(tool)


_probe_result = []


def unavailable_reason():
    """Why test hosts cannot be made here, or `None` if they can.

    Tries once per process to make (and delete) a one-host cluster.
    """
    if not _probe_result:
        try:
            with Cluster(1, shm_size="1m"):
                pass
            _probe_result.append(None)
        except HostsUnavailable as e:
            _probe_result.append(str(e))
        except RuntimeError as e:
            _probe_result.append(f"cannot make namespaced test hosts: {e}")
    return _probe_result[0]


def require():
    """In pytest: skips when hosts cannot be made, fails instead if CI=true."""
    import pytest

    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true but namespaced test hosts are unavailable: {reason}")
    pytest.skip(reason)
