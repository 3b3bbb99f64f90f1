"""Which ranks a kerasdist error blames, whichever path noticed the fault.

The guarantee is that a lost (dead, frozen, cut off) rank is named. Which
part of the engine notices first is a matter of timing: a transfer that
times out ("timed out after 3000 ms sending 262144 bytes to rank 1", or
"receiving ... from rank 1"), rank 0 hearing nothing from a worker, a worker
hearing nothing from rank 0, the direct board, the stall shutdown. Each has
its own wording, so tests check the guarantee with `blamed()` (the set of
ranks the text names as lost) instead of one path's phrase.

A transfer's peer is not blame: in a ring it may be a healthy rank that
waits further round on the lost one, and the roll call that follows every
failed transfer ("; lost: rank 2 (host h) (no answer to a roll call ...")
is what names the lost ranks. `state()` says which path produced a text, so
a test can also check that a fault landed where it meant it to.
"""

import re

_RANK = r"rank \d+(?: \(host [^)]*\))?"
_RANKS = rf"{_RANK}(?:, {_RANK})*"

# Each names the ranks the error blames, in group "who" ("rank N (host h)"
# items) or "nums" (bare numbers).
_BLAME = [
    # The roll call after a failed transfer, or after a rank went silent.
    rf"; lost: (?P<who>{_RANKS}) \(no answer to a roll call",
    # Rank 0: workers silent past the liveness bound that missed the roll call.
    rf"(?P<who>{_RANKS}) ha(?:s|ve) not answered rank 0 for \d+ s while collectives "
    r"wait: stopped or lost the connection",
    # A worker: rank 0 silent and not answering the roll call either.
    rf"(?P<who>{_RANK}) \(the coordinator\) has not answered for \d+ s while this "
    r"rank waits on collectives: it has stopped or lost its connection",
    # The direct board.
    rf"(?P<who>{_RANK}) has shown no sign of life for",
    # The stall shutdown: who never submitted the stalled collective.
    r"but not by ranks \[(?P<nums>\d+(?:, \d+)*)\]",
    # init()'s roll call.
    r"ranks? (?P<nums>\d+(?:, \d+)*) did not answer a roll call",
    # shutdown() not acknowledged: rank 0's, or a worker's of rank 0.
    rf"shut down, but (?P<who>{_RANKS}) did not acknowledge it",
    r"waiting for (?P<who>rank 0) to acknowledge shutdown",
]

# The ranks a roll call heard ("; rank 0 answered", "; ranks 0, 1 answered").
_CLEARED = r"\((?:no answer to a roll call within [0-9.]+ s); ranks? (\d+(?:, \d+)*) answered\)"

_TRANSFER = re.compile(
    r"timed out after (?P<ms>\d+) ms (?P<dir>sending|receiving) (?P<bytes>\d+) bytes "
    r"(?:to|from) rank (?P<peer>\d+) in (?P<op>\w+) '(?P<name>[^']*)'")


def blamed(text):
    """The set of ranks `text` names as lost (or, for a stall, as missing)."""
    ranks = set()
    for pattern in _BLAME:
        for m in re.finditer(pattern, text):
            if "who" in m.re.groupindex:
                ranks |= {int(n) for n in re.findall(r"rank (\d+)", m.group("who"))}
            else:
                ranks |= {int(n) for n in re.findall(r"\d+", m.group("nums"))}
    return ranks


def cleared(text):
    """The set of ranks a roll call in `text` heard from (alive)."""
    ranks = set()
    for m in re.finditer(_CLEARED, text):
        ranks |= {int(n) for n in m.group(1).split(", ")}
    return ranks


def transfer(text):
    """`(direction, peer, op, name)` of a transfer timeout in `text`, or None."""
    m = _TRANSFER.search(text)
    return m and (m.group("dir"), int(m.group("peer")), m.group("op"), m.group("name"))


def state(text):
    """Which path failed: "transfer", "silent worker", "silent coordinator",
    "board", "stall", "deadlock", "init" or "shutdown"; None if unknown."""
    if _TRANSFER.search(text):
        return "transfer"
    for name, needle in [
            ("silent worker", r"not answered rank 0 for \d+ s while collectives wait"),
            ("silent coordinator", r"\(the coordinator\) has not answered for"),
            ("board", r"has shown no sign of life for"),
            ("stall", r"Stall shutdown after|stall: .* \(KERASDIST_STALL_SHUTDOWN"),
            ("deadlock", r"[Dd]eadlock"),
            ("init", r"waiting for all ranks to call init\(\)"),
            ("shutdown", r"shut down, but .* did not acknowledge|"
                         r"waiting for rank 0 to acknowledge shutdown")]:
        if re.search(needle, text):
            return name
    return None


def check(text, lost):
    """Asserts that `text` blames exactly the ranks in `lost` (one int or a
    collection) and clears none of them; returns the failure's state()."""
    lost = {lost} if isinstance(lost, int) else set(lost)
    got = blamed(text)
    assert got == lost, f"blames ranks {sorted(got)}, expected {sorted(lost)}: {text}"
    assert not (cleared(text) & lost), f"a lost rank answered the roll call: {text}"
    assert "so none is lost" not in text, text
    return state(text)
