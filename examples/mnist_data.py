"""Loads MNIST from its original IDX files, offline.

The examples read MNIST from a local directory, so that they run on machines
without internet access. `load_mnist()` looks, in this order, in:

1. the `data_dir` argument,
2. the directory named by the `KERASDIST_DATA_DIR` environment variable,
3. `examples/data/mnist`, the copy shipped with this repository (next to
   this file),

and only when none of them is given or present falls back to
`keras.datasets.mnist.load_data()`, which downloads the data.

A directory holds the four files of the MNIST database, gzip-compressed
(`train-images-idx3-ubyte.gz`, ...) or not (the same names without `.gz`).
The IDX format is a big-endian uint32 magic number (2051 for images, 2049
for labels), one big-endian uint32 per dimension, then the raw uint8 data.
"""

import gzip
import hashlib
import os
import struct

import numpy as np

ENV_VAR = "KERASDIST_DATA_DIR"
REPO_DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mnist")

# The mean and standard deviation of the training pixels, after dividing by
# 255 (from data/mnist/README.md); the examples standardize with them.
PIXEL_MEAN = 0.1307
PIXEL_STD = 0.3081

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049

# name -> (magic, shape, sha256 of the uncompressed bytes). The digests are
# those of the table in data/mnist/README.md.
FILES = {
    "train-images-idx3-ubyte": (
        IMAGES_MAGIC, (60000, 28, 28),
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"),
    "train-labels-idx1-ubyte": (
        LABELS_MAGIC, (60000,),
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"),
    "t10k-images-idx3-ubyte": (
        IMAGES_MAGIC, (10000, 28, 28),
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"),
    "t10k-labels-idx1-ubyte": (
        LABELS_MAGIC, (10000,),
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"),
}


def _read_bytes(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"Could not read the MNIST file {path}: {e}") from e


def parse_idx(data, expected_magic=None, expected_shape=None, source="<bytes>"):
    """Parses the bytes of an uncompressed IDX file of unsigned bytes.

    Args:
        data: The file's uncompressed bytes.
        expected_magic: The magic number the header must hold (2051 for
            images, 2049 for labels), or `None` to accept any uint8 IDX
            magic (`0x00000801` to `0x000008ff`). Defaults to `None`.
        expected_shape: The dimensions the header must hold, or `None` to
            accept any. Defaults to `None`.
        source: What `data` is (a file name), for error messages. Defaults
            to `"<bytes>"`.

    Returns:
        A uint8 numpy array of the header's shape.

    Raises:
        ValueError: If the header is truncated, the magic number or the
            dimensions are not the expected ones, or the data size does not
            match the dimensions.
    """
    if len(data) < 4:
        raise ValueError(
            f"{source} is not an IDX file: it has {len(data)} bytes, fewer "
            "than the 4 of the magic number."
        )
    (magic,) = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    if (magic >> 8) != 0x08 or ndim == 0:
        raise ValueError(
            f"{source} is not an IDX file of unsigned bytes: its magic number "
            f"is {magic} (0x{magic:08x}); expected 2051 (images) or 2049 "
            "(labels). The file may be corrupt or of another format."
        )
    if expected_magic is not None and magic != expected_magic:
        raise ValueError(
            f"{source} has the IDX magic number {magic}, expected "
            f"{expected_magic} ({'images' if expected_magic == IMAGES_MAGIC else 'labels'}). "
            "Are the image and label files swapped?"
        )
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise ValueError(
            f"{source} has a truncated IDX header: {ndim} dimensions need "
            f"{header_size} header bytes, but the file has {len(data)}."
        )
    shape = struct.unpack(f">{ndim}I", data[4:header_size])
    if expected_shape is not None and tuple(shape) != tuple(expected_shape):
        raise ValueError(
            f"{source} has the dimensions {tuple(shape)} in its IDX header, "
            f"expected {tuple(expected_shape)}."
        )
    expected_size = header_size + int(np.prod(shape, dtype=np.int64))
    if len(data) != expected_size:
        raise ValueError(
            f"{source} has {len(data)} bytes, but its IDX header "
            f"(dimensions {tuple(shape)}) announces {expected_size}: the file "
            "is truncated or has trailing bytes."
        )
    # A copy, so that the array is writable (like keras.datasets' arrays).
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(shape).copy()


def _find_file(data_dir, name):
    for candidate in (name + ".gz", name):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"MNIST file {name}.gz (or {name}) not found in {data_dir}. The "
        "directory must hold the four MNIST files: "
        + ", ".join(f"{n}.gz" for n in FILES) + "."
    )


def _load_file(data_dir, name, verify):
    magic, shape, digest = FILES[name]
    path = _find_file(data_dir, name)
    data = _read_bytes(path)
    array = parse_idx(data, expected_magic=magic, expected_shape=shape, source=path)
    if verify:
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ValueError(
                f"{path} has a valid IDX header but its contents differ from "
                f"MNIST's (sha256 of the uncompressed bytes {actual}, expected "
                f"{digest}). The file is corrupt; copy it again, or pass "
                "`verify=False` to load a modified dataset on purpose."
            )
    return array


def _has_files(data_dir):
    return os.path.isdir(data_dir) and all(
        os.path.isfile(os.path.join(data_dir, n + ".gz"))
        or os.path.isfile(os.path.join(data_dir, n)) for n in FILES)


def resolve_data_dir(data_dir=None):
    """Returns the directory `load_mnist` reads, or `None` to download.

    Args:
        data_dir: A directory named by the user, or `None`. Defaults to
            `None`.

    Returns:
        `data_dir` if given, else `$KERASDIST_DATA_DIR` if set, else the
        repository copy `examples/data/mnist` if it holds the files, else
        `None` (meaning: download with `keras.datasets.mnist`).

    Raises:
        FileNotFoundError: If `data_dir` or `$KERASDIST_DATA_DIR` names a
            directory that does not exist (a directory the user names is
            never silently replaced by a download).
    """
    for where, directory in (("data_dir", data_dir),
                             (f"${ENV_VAR}", os.environ.get(ENV_VAR) or None)):
        if directory is not None:
            directory = os.fspath(directory)
            if not os.path.isdir(directory):
                raise FileNotFoundError(
                    f"The MNIST directory {directory} (from {where}) does not "
                    "exist."
                )
            return directory
    return REPO_DATA_DIR if _has_files(REPO_DATA_DIR) else None


def load_mnist(data_dir=None, verify=True):
    """Loads MNIST as uint8 numpy arrays.

    Reads the IDX files from `data_dir`, else from `$KERASDIST_DATA_DIR`,
    else from the repository copy `examples/data/mnist`; only if none is
    given or present, downloads with `keras.datasets.mnist.load_data()`.
    Each header's magic number and dimensions are checked, as is the file
    size, and (with `verify=True`) the sha256 of the uncompressed bytes.

    Args:
        data_dir: Directory with the four MNIST files (gzipped or not).
            Defaults to `None`.
        verify: Whether to check the sha256 of each file's uncompressed
            bytes against the known MNIST digests (the table in
            `examples/data/mnist/README.md`). It takes a fraction of a
            second. Defaults to `True`.

    Returns:
        `(x_train, y_train), (x_test, y_test)`: uint8 arrays of shapes
        `(60000, 28, 28)`, `(60000,)`, `(10000, 28, 28)` and `(10000,)`,
        the same as `keras.datasets.mnist.load_data()`.

    Raises:
        FileNotFoundError: If the named directory or one of its files is
            missing.
        ValueError: If a file is not a valid MNIST IDX file (bad magic
            number, dimensions or size), or its checksum does not match.

    Example:

    >>> (x_train, y_train), (x_test, y_test) = load_mnist()
    >>> x_train.shape, y_train.dtype
    ((60000, 28, 28), dtype('uint8'))
    """
    directory = resolve_data_dir(data_dir)
    if directory is None:
        import keras

        return keras.datasets.mnist.load_data()
    x_train = _load_file(directory, "train-images-idx3-ubyte", verify)
    y_train = _load_file(directory, "train-labels-idx1-ubyte", verify)
    x_test = _load_file(directory, "t10k-images-idx3-ubyte", verify)
    y_test = _load_file(directory, "t10k-labels-idx1-ubyte", verify)
    return (x_train, y_train), (x_test, y_test)


if __name__ == "__main__":
    (xt, yt), (xv, yv) = load_mnist()
    print("directory:", resolve_data_dir())
    print("train", xt.shape, xt.dtype, yt.shape, "test", xv.shape, yv.shape)
    print("label counts:", *np.bincount(yt, minlength=10))
    pixels = xt.astype(np.float64) / 255.0
    print(f"pixel mean {pixels.mean():.4f} std {pixels.std():.4f}")
