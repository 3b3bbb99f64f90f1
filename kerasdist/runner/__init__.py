"""kerasdist's launcher: `kerasdist-run` (cli.py) and `kerasdist.run()`
(launch.py).

It imports only the standard library and its own modules, never TensorFlow
or the rest of kerasdist, so that it starts quickly and can start ranks of
an environment whose build is broken. The one exception runs on request in
the launcher's process: `kerasdist-run --check-build` imports `kerasdist`
to report on the build. The rank-side helpers (supervise.py, run_worker.py)
are run by file path; run_worker.py imports what the user's function needs.
"""

from kerasdist.runner.cli import main  # noqa: F401  (`kerasdist.runner:main`)
