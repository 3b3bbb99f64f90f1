"""Files that every kerasdist checkpoint writes: atomically, and never
through a planted symlink. Used by the checkpoint callbacks
(kerasdist.callbacks) and the elastic state (kerasdist.elastic)."""

import os
import stat
import tempfile


def _umask():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _suffix(base):
    # Keras picks the format from the whole suffix (`.weights.h5`, `.keras`).
    if base.endswith(".weights.h5"):
        return ".weights.h5"
    return os.path.splitext(base)[1]


def atomic_save(save_fn, filepath):
    """Calls `save_fn(tmp_path)`, then renames the result onto `filepath`.

    The temporary file is created by `tempfile.mkstemp` in the target's
    directory, with an unpredictable name, exclusively (so nothing planted
    at that path, such as a symlink, is ever written through), and with the
    target's suffix (Keras picks the format from it). It gets the mode of a
    normally created file (`0o666` minus the umask). After `save_fn` returns,
    the path must still be that same regular file; then `os.replace` moves
    it into place atomically (replacing a symlink at `filepath` itself, not
    its target). A process killed during a save leaves the previous file
    intact; on any error the temporary file is removed.

    Args:
        save_fn: Called with the temporary path; writes the file there, e.g.
            `model.save` or `model.save_weights`.
        filepath: The final path.

    Raises:
        OSError: If the temporary path stopped being the file created for
            it (it was replaced, e.g. by a symlink), or the write failed.
    """
    filepath = os.fspath(filepath)
    directory, base = os.path.split(os.path.abspath(filepath))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=_suffix(base), dir=directory)
    try:
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            created = os.fstat(fd)
        finally:
            os.close(fd)
        save_fn(tmp)
        now = os.lstat(tmp)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
                created.st_dev, created.st_ino):
            raise OSError(
                f"The temporary file {tmp} for {filepath} was replaced while "
                "it was being written (it is no longer the regular file "
                "created for the save). Nothing was moved into place; check "
                f"who else writes to {directory}."
            )
        os.replace(tmp, filepath)
    except BaseException:
        try:
            os.unlink(tmp)  # a symlink itself, never its target
        except FileNotFoundError:
            pass
        raise
