"""Relays the ranks' output for `kerasdist-run`: tags, lines, prefixes.

The MPI process manager tags what each rank writes with its rank:

- MPICH's Hydra (`-prepend-pattern`) puts our pattern before every chunk
  it relays and after every newline inside one. A line a rank writes in
  pieces therefore carries tags mid-line, and chunks of other ranks can sit
  in between. The pattern is made of control characters and, in
  `kerasdist-run`, a random token per launch, so a rank cannot print
  another rank's tag by accident.
- Open MPI (`--tag-output`) writes a printable `[job,rank]<stdout>: ` tag.

`_Demux` re-assembles each rank's lines from such a stream and `_Sink`
writes them with a `[rank] ` prefix.
"""

import os
import re

HYDRA_TAG_START = "\x1ekd"


def hydra_pattern(token=""):
    """Returns Hydra's `-prepend-pattern` value for `token` (`%r`: rank)."""
    return f"{HYDRA_TAG_START}{token}:%r\x1f"


def _markers(flavor, token):
    """Returns (regex with the rank as group 1, its first byte, line starts
    only) for `flavor`."""
    if flavor == "mpich":
        regex = re.compile(re.escape(HYDRA_TAG_START.encode() + token.encode())
                           + rb":(\d+)\x1f")
        return regex, HYDRA_TAG_START.encode()[:1], False
    if flavor == "openmpi":
        return re.compile(rb"\[\d+,(\d+)\]<std(?:out|err)>: ?"), b"[", True
    raise ValueError("Invalid value for argument `flavor`. Expected 'mpich' "
                     f"or 'openmpi'. Received: flavor={flavor}")


class _Demux:
    """Re-assembles lines from a rank-tagged stream, calling `emit(rank, line)`.

    `rank` is None for mpiexec's own output. Unterminated lines are emitted
    at the end of the stream.

    A tag counts only where the process manager puts one: at the start of a
    line of the stream (its start, or after a newline) and, for Hydra, which
    tags every chunk it relays, also where another chunk ended mid-line; never
    right after a tag (at the start of a rank's own text). Anything else that
    looks like a tag is the rank's own text.

    Args:
        flavor: `"mpich"` or `"openmpi"`.
        emit: Called with `(rank, line_bytes)`.
        token: The random part of the Hydra pattern (see `hydra_pattern`).
    """

    def __init__(self, flavor, emit, token=""):
        self._marker, self._start, self._line_starts = _markers(flavor, token)
        self._emit, self._pending, self._rank, self._partial = emit, b"", None, {}
        self._prev = b""  # The stream's last byte before `_pending`.
        self._tagged = False  # Nothing since the last tag.

    def feed(self, data, final=False):
        buf, self._pending = self._pending + data, b""
        cut = buf.rfind(self._start)
        match = self._marker.match(buf, cut) if cut != -1 else None
        if (not final and cut != -1 and len(buf) - cut < 64
                and b"\n" not in buf[cut:]
                and (match is None or match.end() == len(buf))):
            # Maybe a marker split across reads (or Open MPI's optional
            # space after it still to come).
            buf, self._pending = buf[:cut], buf[cut:]
        pos = 0
        for match in self._marker.finditer(buf):
            start = match.start()
            before = buf[start - 1:start] if start else self._prev
            if self._line_starts and before not in (b"", b"\n"):
                continue
            if start == pos and self._tagged:
                continue  # Right after a tag: the rank printed it.
            if start > pos:
                self._add(buf[pos:start])
            self._rank, pos, self._tagged = int(match.group(1)), match.end(), True
        if pos < len(buf):
            self._add(buf[pos:])
        if buf:
            self._prev = buf[-1:]
        if final:
            for rank in sorted(self._partial, key=lambda r: (r is None, r or 0)):
                self._emit(rank, self._partial[rank])
            self._partial.clear()

    def _add(self, seg):
        self._tagged = False
        while seg:
            nl = seg.find(b"\n") + 1
            cr = seg.find(b"\r") + 1
            if cr and (not nl or cr < nl - 1):
                # A carriage return (not of "\r\n"): an in-place update such
                # as a progress bar. The rank keeps writing the same line.
                self._emit(self._rank, self._partial.pop(self._rank, b"") + seg[:cr])
                seg = seg[cr:]
                continue
            if not nl:
                self._partial[self._rank] = self._partial.get(self._rank, b"") + seg
                return
            self._emit(self._rank, self._partial.pop(self._rank, b"") + seg[:nl])
            # Every line of a chunk is tagged: untagged bytes after a newline
            # come from mpiexec itself.
            seg, self._rank = seg[nl:], None


_NOBODY = object()  # no rank's line is being redrawn in place
# Hydra's report when a process dies from a signal. When a supervised rank
# failed (and killed itself to stop the job) it names the supervisor's
# signal, not the rank's status: `kerasdist-run` then leaves it out.
_BANNER = re.compile(
    rb"(\s*|=+|=   .*|YOUR APPLICATION TERMINATED WITH THE EXIT STRING: .*"
    rb"|This typically refers to a problem with your application\."
    rb"|Please see the FAQ page for debugging suggestions)\r?\n?")


class _Sink:
    """Writes lines to a console stream (rank-prefixed) and per-rank files.

    Args:
        stream: Console stream (e.g. `sys.stdout`), or None.
        name: File name in `output_dir/rank.<r>/` ("stdout", "stderr").
        output_dir: Directory for per-rank files, or None.
        num_proc: Number of ranks.
        append: Append to the per-rank files instead of truncating them.
        observe: Called with `(rank, line)` for every complete rank line.
        hold_banner: Hold mpiexec's own lines that look like Hydra's
            termination banner until `finish()`.
    """

    def __init__(self, stream, name, output_dir, num_proc, append=False,
                 observe=None, hold_banner=False):
        self._stream, self._files = stream, {}
        try:  # on a terminal, in-place updates ("\r") are redrawn live
            self._live = bool(stream is not None and stream.isatty())
        except (AttributeError, ValueError):
            self._live = False
        self._held, self._inplace = {}, _NOBODY
        self._observe, self._hold_banner, self._banner = observe, hold_banner, []
        for rank in range(num_proc if output_dir else 0):
            os.makedirs(os.path.join(output_dir, f"rank.{rank}"), exist_ok=True)
            self._files[rank] = open(
                os.path.join(output_dir, f"rank.{rank}", name),
                "ab" if append else "wb")

    def __call__(self, rank, line):
        if rank is None and self._hold_banner:
            if _BANNER.fullmatch(line):
                self._banner.append(line)
                return
            self.finish(drop_banner=False)  # Not the banner after all.
        if rank is not None and self._observe and line.endswith(b"\n"):
            self._observe(rank, line)
        self._show(rank, line)

    def finish(self, drop_banner):
        """Emits (or, if `drop_banner`, drops) the held banner lines."""
        held, self._banner = self._banner, []
        for line in () if drop_banner else held:
            self._show(None, line)

    def _show(self, rank, line):
        if rank in self._files:
            self._files[rank].write(line)
            self._files[rank].flush()
        prefix = b"" if rank is None else b"[%d] " % rank
        if line.endswith(b"\r"):  # an in-place update (see _Demux)
            if not self._live:  # a file or pipe: show the line once it ends
                self._held[rank] = self._held.get(rank, b"") + line
                return
            shown = line.rstrip(b"\r\b")
            if not shown:
                return
            # Redraw this rank's line in place (a new row if another rank's
            # update was showing), then clear what is left of the old one.
            sep = b"\n" if self._inplace not in (_NOBODY, rank) else b""
            self._inplace = rank
            return self._write(sep + b"\r" + prefix + shown + b"\x1b[K")
        if self._live:
            sep = {_NOBODY: b"", rank: b"\r"}.get(self._inplace, b"\n")
            self._inplace = _NOBODY
        else:
            sep, line = b"", self._held.pop(rank, b"") + line
        text = line[:-1] if line.endswith(b"\n") else line
        self._write(sep + prefix + text + (b"\x1b[K\n" if sep == b"\r" else b"\n"))

    def _write(self, text):
        try:
            if self._stream is None:
                return
            if hasattr(self._stream, "buffer"):
                self._stream.buffer.write(text)
                self._stream.buffer.flush()
            else:
                self._stream.write(text.decode(errors="replace"))
                self._stream.flush()
        except (OSError, ValueError):  # E.g. `| head` closed our stdout.
            self._stream = None

    def pump(self, pipe, flavor, token=""):
        demux = _Demux(flavor, self, token)
        for data in iter(lambda: os.read(pipe.fileno(), 65536), b""):
            demux.feed(data)
        demux.feed(b"", final=True)
        for f in self._files.values():
            f.close()
