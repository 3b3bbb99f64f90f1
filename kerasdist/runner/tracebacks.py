"""Tracebacks from `kerasdist.run`'s ranks, made readable again.

cloudpickle sends functions defined in `__main__` or a notebook by value;
their frames then come back as `File "<dynamic-code>"`. These helpers match
such frames against the caller's code objects to restore file names and
source lines.
"""

import linecache
import re
import types

_DYNAMIC_FRAME = re.compile(r'^  File "<dynamic-code>", line (\d+), in (.+)$')


def reachable_code(fn, limit=200):
    """Code objects of `fn` and of the functions it references, nested ones
    included: what cloudpickle may have sent by value."""
    codes, seen_fns, todo = [], set(), [fn]
    while todo and len(codes) < limit:
        f = todo.pop()
        f = getattr(f, "__func__", getattr(f, "func", f))  # Method, partial.
        if not isinstance(f, types.FunctionType) or id(f) in seen_fns:
            continue
        seen_fns.add(id(f))
        stack = [f.__code__]
        while stack:
            code = stack.pop()
            codes.append(code)
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
            todo += [f.__globals__[n] for n in code.co_names
                     if n in f.__globals__]
        for cell in f.__closure__ or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # Empty cell.
                pass
    return codes


def resolve_dynamic_frames(text, fn):
    """Restores the file names and source lines that cloudpickle dropped
    (`File "<dynamic-code>"`) from the tracebacks of functions sent by value,
    matching the frames against the caller's code objects."""
    if "<dynamic-code>" not in text:
        return text
    codes = reachable_code(fn)
    out = []
    for line in text.splitlines(keepends=True):
        match = _DYNAMIC_FRAME.match(line.rstrip("\n"))
        if match:
            lineno, name = int(match.group(1)), match.group(2)
            files = {c.co_filename for c in codes if c.co_name == name and
                     lineno in {n for _, _, n in c.co_lines()}}
            if len(files) == 1:
                filename = files.pop()
                out.append(f'  File "{filename}", line {lineno}, in {name}\n')
                source = linecache.getline(filename, lineno).strip()
                if source:
                    out.append(f"    {source}\n")
                continue
        out.append(line)
    return "".join(out)


def resolve(errors, fn):
    """Applies `resolve_dynamic_frames` to each rank's error record."""
    return {rank: dict(rec, traceback=resolve_dynamic_frames(
        rec["traceback"], fn)) for rank, rec in errors.items()}
