"""kerasdist's framework-neutral runtime: configuration, the native
library, the process state (`basics.Context`), process sets and the build
queries. Nothing here imports TensorFlow or Keras (but the interim loader
in library.py); framework bindings such as `kerasdist.tensorflow` build on
it.
"""
