"""Hosts for `kerasdist-run`: `-H`, `--hostfile`, a Slurm allocation, and
where the ranks go.

Every host gets one contiguous block of ranks, in the order the hosts are
given, so the ranks of a host are neighbours in the ring.
"""

import re

_SLOTS = re.compile(r"[1-9]\d*")


def parse_hosts(value, flag="-H"):
    """Parses `host1:2,host2:2` (`host` alone: 1 slot).

    Args:
        value: The option's value.
        flag: The option's name, for the error message.

    Returns:
        A list of `(host, slots)` pairs, repeated hosts merged into the
        first one's place.

    Raises:
        ValueError: If the value is malformed.
    """
    pairs = []
    for entry in value.split(","):
        name, sep, slots = entry.strip().partition(":")
        if not name or (sep and not _SLOTS.fullmatch(slots)):
            raise ValueError(
                f"Invalid value for argument `{flag}`. Expected comma-separated "
                "`host` or `host:slots` entries, e.g. `host1:2,host2:2`. "
                f"Received: {flag}={value}")
        pairs.append((name, int(slots) if sep else 1))
    return merge(pairs)


def parse_hostfile(text, path="hostfile"):
    """Parses a hostfile: per line `host`, `host:N` (MPICH) or
    `host slots=N` (Open MPI); `#` starts a comment.

    Returns:
        A list of `(host, slots)` pairs, repeated hosts merged.

    Raises:
        ValueError: If a line is malformed or there is no host.
    """
    pairs = []
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        host, slots, bad = words[0], 1, False
        if ":" in host:
            host, _, count = host.partition(":")
            bad = not (host and _SLOTS.fullmatch(count))
            slots = int(count) if not bad else 0
        for word in words[1:]:
            key, _, count = word.partition("=")
            if key in ("slots", "max_slots", "max-slots") and _SLOTS.fullmatch(count):
                slots = int(count) if key == "slots" else slots
            else:
                bad = True
        if bad:
            raise ValueError(
                "Invalid value for argument `--hostfile`. Expected lines "
                "`host`, `host:slots` or `host slots=N`. Received: line "
                f"{number} of {path}: {raw.strip()!r}")
        pairs.append((host, slots))
    if not pairs:
        raise ValueError("Invalid value for argument `--hostfile`. Expected at "
                         f"least one host. Received: {path} lists none.")
    return merge(pairs)


def merge(pairs):
    """Merges repeated hosts (adding their slots), keeping first positions."""
    slots = {}
    for host, count in pairs:
        slots[host] = slots.get(host, 0) + count
    return list(slots.items())


def _split_top(text, sep=","):
    """Splits `text` at `sep` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise ValueError
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError
    return parts + [text[start:]]


def _expand_name(expr):
    names = [""]
    for match in re.finditer(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", expr):
        literal, group = match.group(1), match.group(2)
        choices = [literal]
        if group is not None:
            choices = []
            for item in group.split(","):
                low, dash, high = item.partition("-")
                if not low.isdigit() or (dash and not high.isdigit()):
                    raise ValueError
                if not dash:
                    choices.append(literal + low)
                    continue
                if int(high) < int(low):
                    raise ValueError
                choices += [literal + str(n).zfill(len(low))
                            for n in range(int(low), int(high) + 1)]
        names = [n + c for n in names for c in choices]
    return names


def expand_nodelist(nodelist):
    """Expands Slurm's compressed node list, e.g. `node[01-03,07],login1`
    -> `["node01", "node02", "node03", "node07", "login1"]`.

    Several bracket groups in one name expand to all combinations
    (`r[1-2]n[1-2]` -> `r1n1, r1n2, r2n1, r2n2`); zero padding is kept.

    Raises:
        ValueError: If the list is malformed.
    """
    try:
        names = []
        for expr in _split_top(nodelist.strip()):
            if not expr.strip():
                raise ValueError
            names += _expand_name(expr.strip())
        return names
    except ValueError:
        raise ValueError(
            "Invalid value for `SLURM_JOB_NODELIST`. Expected Slurm's node "
            "list syntax, e.g. `node[01-03,07],login1`. Received: "
            f"{nodelist!r}") from None


def expand_tasks_per_node(value):
    """Expands Slurm's per-node counts, e.g. `2(x3),1` -> `[2, 2, 2, 1]`.

    Raises:
        ValueError: If the value is malformed.
    """
    counts = []
    for item in value.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if not match or (match.group(2) and int(match.group(2)) < 1):
            raise ValueError(
                "Invalid value for `SLURM_TASKS_PER_NODE`. Expected Slurm's "
                f"counts, e.g. `2(x3),1`. Received: {value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_hosts(environ):
    """Returns the `(host, slots)` pairs of the Slurm allocation `environ`
    describes, or None outside one.

    Reads `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`) and the slots per node
    from `SLURM_TASKS_PER_NODE`, else `SLURM_JOB_CPUS_PER_NODE`, else 1.

    Raises:
        ValueError: If the variables are malformed or disagree.
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    nodes = expand_nodelist(nodelist)
    for name in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        if environ.get(name):
            counts = expand_tasks_per_node(environ[name])
            break
    else:
        name, counts = None, [1] * len(nodes)
    if len(counts) != len(nodes):
        raise ValueError(
            f"Invalid value for `{name}`. Expected one count per node of "
            f"SLURM_JOB_NODELIST ({len(nodes)} nodes). Received: "
            f"{environ[name]!r} ({len(counts)} counts)")
    return merge((n, c) for n, c in zip(nodes, counts) if c > 0)


def place(hosts, np):
    """Places `np` ranks on `hosts`, one contiguous block per host.

    Hosts are filled in order up to their slots. If `np` exceeds the slots,
    every host takes its share of the extra ranks (oversubscription).

    Args:
        hosts: List of `(host, slots)` pairs.
        np: Number of ranks.

    Returns:
        A list of `(host, ranks)` pairs with a positive count each and
        counts summing to `np`.
    """
    total = sum(slots for _, slots in hosts)
    if np <= total:
        placed, left = [], np
        for host, slots in hosts:
            if left > 0:
                placed.append((host, min(slots, left)))
                left -= min(slots, left)
        return placed
    extra, n = np - total, len(hosts)
    return [(host, slots + extra // n + (i < extra % n))
            for i, (host, slots) in enumerate(hosts)]


def host_of_rank(placement, rank):
    """Returns the host of `rank` in `placement`, or None if out of range."""
    for host, count in placement:
        if rank < count:
            return host
        rank -= count
    return None


def format_hosts(placement):
    """Formats a placement as `host1:2,host2:2`."""
    return ",".join(f"{host}:{count}" for host, count in placement)
