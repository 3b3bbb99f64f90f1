"""kerasdist's framework-neutral runtime.

    config.py        the `KERASDIST_*` settings
    library.py       loads the native library (ctypes)
    context.py       the process state: `Context`, `context`
    basics.py        init(), shutdown(), rank(), size(), ..., build_info()
    process_sets.py  `ProcessSet` and its registry
    queries.py       the build and run-time queries that need no framework
    bindings.py      what a framework binding provides the runtime
    files.py         atomic checkpoint files

Nothing here imports TensorFlow or Keras, but the interim loader in
library.py; framework bindings such as `kerasdist.tensorflow` build on it.
"""
