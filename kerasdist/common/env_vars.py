"""The `KERASDIST_*` environment variables: the one table of the settings a
user can set, with their defaults and meaning.

The code that reads each variable is elsewhere (common/config.py for the
engine's, the bindings and the runner for theirs); this table is what the
documentation's configuration page is generated from (docs/generate.py), and
tests/test_docs.py checks that every `KERASDIST_*` name the Python code reads
is here.
"""

# (name, default, meaning), in the order of the documentation.
ENV_VARS = (
    ('KERASDIST_FUSION_THRESHOLD', '67108864',
     'Fusion buffer size in bytes; ready allreduces of one dtype/op are packed up to '
     'this.'),
    ('KERASDIST_FUSION_TENSOR_LIMIT', '1048576',
     'An allreduce of at least this many bytes is never packed into the fusion '
     'buffer: it runs alone, reduced from its input straight into its output, which '
     "saves copying it in and out (fusion saves one collective's latency, tens of µs,"
     ' less than copying a MiB costs). `0`: pack every tensor that fits the '
     'threshold, as Horovod does.'),
    ('KERASDIST_TORCH_BUCKET_BYTES', '4194304',
     '`kerasdist.torch.DistributedOptimizer` with `groups=None`: gradients are '
     'reduced in buckets of consecutive parameters of up to this many bytes, filled '
     'from the last parameter (as DDP does), each one allreduce once all its '
     'gradients are ready (copied into one flat buffer per bucket, as DDP does; '
     'Adasum keeps one request per gradient). `0`: one allreduce per parameter.'),
    ('KERASDIST_TORCH_THREADS', "this rank's share of the cores",
     "PyTorch's intra-op threads, set by `init()` when `kerasdist.torch` is imported;"
     ' when neither this nor `OMP_NUM_THREADS` is set, the cores divided by the ranks'
     ' on the host.'),
    ('KERASDIST_CYCLE_TIME', '1.0',
     'Milliseconds a ready allreduce may wait for others still arriving, to fuse '
     'them.'),
    ('KERASDIST_STALL_CHECK_TIME_SECONDS', '60',
     'Warn (naming the tensor and the missing ranks) when a collective waits this '
     'long.'),
    ('KERASDIST_STALL_SHUTDOWN_TIME_SECONDS', '0 (off)',
     'Abort any collective that waits this long on every rank, even when a rank is '
     'only slow (busy elsewhere).'),
    ('KERASDIST_DEADLOCK_TIME_SECONDS', '60',
     'Abort a deadlock: every rank waits on a collective that another has not '
     'submitted, and nothing new has arrived for this long. The error names what each'
     ' rank waits on. `0` turns the check off.'),
    ('KERASDIST_TIMELINE', 'unset',
     'Rank 0 writes a Chrome-trace JSON (negotiation, fusion copies, ring phases); '
     'open it in Perfetto.'),
    ('KERASDIST_TIMEOUT_SECONDS', '60',
     'Bound on every single wait for a peer inside a collective, and (with at least 4'
     ' s) on how long a rank may stay silent (no heartbeat) while others wait on it: '
     'a dead, frozen or cut-off peer becomes an error naming it and its host.'),
    ('KERASDIST_INIT_TIMEOUT_SECONDS', '300',
     'How long `init()` waits for all ranks to call it.'),
    ('KERASDIST_SEGMENT_BYTES', '262144',
     'Ring segment size (pipelining granularity).'),
    ('KERASDIST_SMALL_ALLREDUCE_BYTES', '32768',
     "Allreduces (after fusion) of at most this many bytes skip the ring's 2(N-1) "
     'steps: a direct exchange (every rank sends its buffer to the others and reduces'
     ' all of them in rank order, one step) up to 4 ranks, recursive doubling beyond.'
     ' `0`: always the ring.'),
    ('KERASDIST_DIRECT_ALLREDUCE_BYTES', '65536',
     'When every rank runs on one host, a single allreduce of at most this many bytes'
     ' skips the coordinator from its third call on: each rank posts its input to a '
     'shared-memory board and reduces all posts itself, in rank order, with no '
     "message and no engine thread in between. Each name's place on the board is "
     'sized to its tensor, in a 16 MiB segment of `/dev/shm` (at np=2, about 990 '
     'names of 4 KiB or 63 of 64 KiB); a name that outgrows its place gets a larger '
     'one after one call through the coordinator. Names beyond that, larger tensors '
     'and jobs on several hosts go through the coordinator as before. `0` turns it '
     'off.'),
    ('KERASDIST_DIRECT_GROUP_BYTES', '1048576',
     'The same for a `grouped_allreduce` whose tensors share a dtype, by their total '
     'bytes: the group gets one place on the board and each call posts all its '
     'tensors back to back, as one round (a step of 100 × 4 KiB no longer passes 100 '
     "requests through the engine thread). Its place takes 2 × ranks × the group's "
     'bytes of the 16 MiB segment (4 MiB for 1 MiB at np=2); a group that does not '
     'fit stays with the coordinator. Groups of mixed dtypes always go through the '
     'coordinator. `0` turns it off.'),
    ('KERASDIST_CACHE_CAPACITY', '1024',
     'Named collectives whose metadata every rank caches (later calls send only an '
     'id). Past this, the least recently used are evicted, and an evicted id is '
     'reused only after every rank has dropped it. Unnamed eager collectives are '
     'never cached and cycle through 64 names.'),
    ('KERASDIST_HIERARCHICAL_ALLREDUCE', 'auto',
     '`auto`: reduce within each host first, then across hosts, when several hosts '
     'run the same number (> 1) of ranks each; `1` wherever the layout allows it; `0`'
     ' always the flat ring. `transport_info()` ends in `; hierarchical allreduce` '
     'when it is on.'),
    ('KERASDIST_SPIN_MICROSECONDS', '30 when every rank runs on one host, 0 across hosts',
     'How long the engine thread keeps polling for new requests after its last '
     "activity before it sleeps, and how long a collective's kernel, when the engine "
     'had nothing else to do, waits on its own thread for the result (TensorFlow then'
     ' runs the next op on that thread instead of waking another). Both poll with '
     '`sched_yield`. It cut a 4 KiB allreduce in a `tf.function` from about 27 to 14 '
     'µs at np=1 on a 2-core machine; `0` turns both off. Across hosts a collective '
     'takes longer than any useful spin, and in the 4x1 benchmark (four ranks sharing'
     ' 2 cores) the spin cost 10–30% of the bus bandwidth from 64 KiB to 16 MiB, '
     'hence no spin there by default (a process set decides by its own ranks). May '
     'differ between ranks.'),
    ('KERASDIST_SHM', '1',
     'Ring links between ranks on one host carry data through `/dev/shm` (reducing '
     'straight out of the shared slots); `0` keeps all data on MPI. Per link, both '
     'ends fall back to MPI when either has it off, cannot map the segment, or cannot'
     ' reserve its pages (a full `/dev/shm`, with a warning). '
     '`kerasdist.transport_info()` says which links use it. Unlike the settings '
     'below, it may differ between ranks.'),
    ('KERASDIST_RESTART', 'unset (set by `kerasdist-run`)',
     'The restart this job is in: `kerasdist-run --max-restarts` sets it to 1, 2, ...'
     ' for the ranks of each restart; `kerasdist.elastic` and `BackupAndRestore` read'
     ' it.'),
    ('KERASDIST_ELASTIC_DIR', '`./kerasdist_elastic`',
     'Where the elastic states (`kerasdist.elastic`, `kerasdist.torch.elastic`) '
     'commit when no `checkpoint_dir` is given. Only rank 0 writes there.'),
)

# Said after the table.
NOTES = (
    'Settings that shape the wire (`KERASDIST_SEGMENT_BYTES`, '
    '`KERASDIST_SMALL_ALLREDUCE_BYTES`, `KERASDIST_DIRECT_ALLREDUCE_BYTES`, '
    '`KERASDIST_DIRECT_GROUP_BYTES`, `KERASDIST_FUSION_THRESHOLD`, '
    '`KERASDIST_FUSION_TENSOR_LIMIT`, `KERASDIST_CYCLE_TIME`, '
    '`KERASDIST_HIERARCHICAL_ALLREDUCE`, and the kerasdist version) must be the same '
    'on every rank: `init()` exchanges them once and fails on every rank with a '
    'message naming the setting and the ranks that differ. `KERASDIST_SHM` is '
    'deliberately exempt: both ends of each link agree on it, so a rank with it off '
    'only moves its own links to MPI. Numbers must be finite and non-negative (`nan`,'
    ' `inf` and negative values are errors).')
