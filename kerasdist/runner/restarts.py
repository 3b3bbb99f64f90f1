"""When `kerasdist-run --max-restarts` starts a failed job again, and where."""

from kerasdist.runner import hosts as _hosts


class RestartPolicy:
    """Decides whether to restart a failed job, and on which hosts.

    The job restarts after a failure while restarts are left. With hosts
    known and `min_np` set, a host on which the failing rank ran in two
    attempts in a row is left out of the next attempt, together with its
    ranks, if at least `min_np` ranks remain.

    Args:
        np: Number of ranks of the first attempt.
        hosts: `(host, slots)` pairs, or None (no hosts known).
        max_restarts: How many times the job may be restarted.
        min_np: Fewest ranks an attempt may have after leaving out a host,
            or None to never leave out a host.

    Attributes:
        np: Number of ranks of the next attempt.
        placement: `(host, ranks)` pairs of the next attempt, or None.
        restarts: Restarts done so far.
    """

    def __init__(self, np, hosts, max_restarts, min_np=None):
        self.np, self.restarts = np, 0
        self.placement = _hosts.place(hosts, np) if hosts else None
        self._max, self._min_np = max_restarts, min_np
        self._last_host, self._streak = None, 0

    def host_of(self, rank):
        """Returns the host of `rank` in the current attempt, or None."""
        if self.placement is None or rank is None:
            return None
        return _hosts.host_of_rank(self.placement, rank)

    def after_failure(self, rank):
        """Records a failed attempt whose first failing rank was `rank`
        (None: unknown).

        Returns:
            `(restart, notes)`: whether to start the job again (with
            `self.np` and `self.placement`), and lines to print about the
            hosts.
        """
        host, notes = self.host_of(rank), []
        self._streak = self._streak + 1 if host and host == self._last_host else 1
        self._last_host = host
        if self.restarts >= self._max:
            return False, notes
        self.restarts += 1
        if host is None or self._min_np is None or self._streak < 2:
            return True, notes
        rest = [(h, n) for h, n in self.placement if h != host]
        left = sum(n for _, n in rest)
        if rest and left >= self._min_np:
            notes.append(f"leaving out host {host} (it failed twice in a "
                         f"row): {left} ranks on {_hosts.format_hosts(rest)}")
            self.placement, self.np = rest, left
            self._last_host, self._streak = None, 0
        else:
            notes.append(f"host {host} failed twice in a row, but leaving it "
                         f"out would leave {left} ranks, fewer than "
                         f"--min-np={self._min_np}; keeping it")
        return True, notes
