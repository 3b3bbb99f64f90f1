"""Alias module for Horovod's `horovod.tensorflow.keras`.

`import kerasdist.keras as hvd` gives the same names as `import kerasdist as
hvd`; it exists so that scripts written against Horovod's Keras module need
only their import line changed.
"""

from kerasdist import *  # noqa: F401,F403
from kerasdist import callbacks  # noqa: F401
