"""The exceptions Horovod's APIs raise, shared by every binding.

`HorovodInternalError` is what Horovod raises when a collective fails at
run time (a peer failed or stopped, the ranks disagree, a bound ran out);
kerasdist's PyTorch binding raises it, and the runtime's `CollectiveError`
is one. `HostsUpdatedInterrupt` exists for scripts that catch it: on MPI
the hosts of a running job never change, so kerasdist never raises it.
"""


class HorovodInternalError(RuntimeError):
    """A collective failed at run time; the message says which ranks and
    tensors were involved and why."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal that the elastic host set changed (never raised by
    kerasdist: a restart of the job replaces lost hosts).

    Args:
        skip_sync: Whether the state need not be synced after the update.
    """

    def __init__(self, skip_sync=False):
        super().__init__("The hosts of the job changed.")
        self.skip_sync = skip_sync
