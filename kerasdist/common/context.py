"""kerasdist's process state: one explicit `Context` object, `context`.

`init()` and `shutdown()` (kerasdist/common/basics.py) fill and clear it;
the process sets, the framework bindings and the Keras layer read it. The
C++ engine behind it keeps its own single Context, created by `init()`.
"""

from kerasdist.common import library


class Context:
    """The Python side of kerasdist's process state.

    Attributes:
        lib: The native library (`ctypes.CDLL`) with its C entry points.
        library_path: Its path.
        initialized: True between `init()` and `shutdown()`.
        comm: `init()`'s mpi4py communicator.
        rank, size, local_rank, local_size, cross_rank, cross_size: This
            process's place in the job (`None` before `init()`).
        config: The `KERASDIST_*` settings read by `init()`.
        process_sets: Registered process sets by id (not the global one).
    """

    def __init__(self):
        self.lib, self.library_path = library.load()
        self.initialized = False
        self.comm = None
        self.rank = self.size = None
        self.local_rank = self.local_size = None
        self.cross_rank = self.cross_size = None
        self.homogeneous = None
        self.hierarchical = None
        self.config = None
        self.name_counters = {}
        self.atexit_registered = False
        # init(comm=[...])'s agreement: buffers of sends MPI may still read,
        # and whether a failed agreement may have left messages unreceived.
        self.sent_buffers = []
        self.stray_messages = False
        self.process_sets = {}  # id -> ProcessSet (kerasdist.common.process_sets)
        self.next_process_set_id = 1
        # The asynchronous collectives of the bindings that hand out
        # Horovod-style integer handles (kerasdist.torch): handle -> entry.
        self.pending = {}
        self.pending_names = {}  # name -> the last handle given that name
        self.next_handle = 0

    # Unnamed eager collectives cycle through this many names. TensorFlow
    # keeps one eager kernel per distinct `tensor_name` attribute (about
    # 36 KiB each), so a fresh name per call grew memory without bound. An
    # eager call returns only once every rank has run it, so by the time a
    # name comes round again its previous use has finished everywhere.
    NONAME_POOL = 64

    def next_name(self, kind, pooled=True):
        """A name for an unnamed eager collective; equal across ranks that
        issue the same sequence of calls.

        `pooled=False` never repeats a name, for bindings whose unnamed
        collectives may be many in flight at once (asynchronous handles).
        """
        n = self.name_counters.get(kind, 0)
        self.name_counters[kind] = n + 1
        return f"{kind}.noname.{n % self.NONAME_POOL if pooled else n}"


context = Context()


def check_initialized():
    """Raises `RuntimeError` unless kerasdist is initialized."""
    if not context.initialized:
        raise RuntimeError(
            "kerasdist is not initialized. Call `kerasdist.init()` first."
        )
