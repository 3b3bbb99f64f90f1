"""kerasdist's settings: the `KERASDIST_*` environment variables.

`read_config()` reads them when `init()` starts the engine; an invalid value
is a `ValueError` that names the variable, what it expects and what it got.
"""

import math
import os

_MIB = 1024 * 1024


def _env_number(name, default, kind=float, minimum=0):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum:
        expected = "an integer" if kind is int else "a finite number"
        raise ValueError(
            f"Invalid value for environment variable {name}. Expected "
            f"{expected} >= {minimum}. Received: {name}={raw!r}"
        )
    return value


def read_config():
    """Reads the `KERASDIST_*` environment variables into a dict."""
    return {
        "fusion_threshold": _env_number(
            "KERASDIST_FUSION_THRESHOLD", 64 * _MIB, int
        ),
        "cycle_time_ms": _env_number("KERASDIST_CYCLE_TIME", 1.0),
        "stall_check_s": _env_number("KERASDIST_STALL_CHECK_TIME_SECONDS", 60.0),
        "stall_shutdown_s": _env_number(
            "KERASDIST_STALL_SHUTDOWN_TIME_SECONDS", 0.0
        ),
        "deadlock_s": _env_number("KERASDIST_DEADLOCK_TIME_SECONDS", 60.0),
        "timeout_s": _env_number("KERASDIST_TIMEOUT_SECONDS", 60.0, minimum=0.001),
        "init_timeout_s": _env_number(
            "KERASDIST_INIT_TIMEOUT_SECONDS", 300.0, minimum=0.001
        ),
        "segment_bytes": _env_number("KERASDIST_SEGMENT_BYTES", 256 * 1024, int, 1),
        "shared_memory": _env_flag("KERASDIST_SHM", True),
        "hierarchical": _env_choice("KERASDIST_HIERARCHICAL_ALLREDUCE"),
        "cache_capacity": _env_number("KERASDIST_CACHE_CAPACITY", 1024, int, 16),
        "small_allreduce_bytes": _env_number(
            "KERASDIST_SMALL_ALLREDUCE_BYTES", 32 * 1024, int, 0
        ),
        "fusion_tensor_limit": _env_number(
            "KERASDIST_FUSION_TENSOR_LIMIT", _MIB, int, 0
        ),
        "spin_us": _env_number("KERASDIST_SPIN_MICROSECONDS", -1, int, 0),  # -1: by topology
        "direct_allreduce_bytes": _env_number(
            "KERASDIST_DIRECT_ALLREDUCE_BYTES", 64 * 1024, int, 0
        ),
        "direct_group_bytes": _env_number(
            "KERASDIST_DIRECT_GROUP_BYTES", _MIB, int, 0
        ),
        "timeline": os.environ.get("KERASDIST_TIMELINE", ""),
    }


def _env_flag(name, default):
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(
        f"Invalid value for environment variable {name}. Expected 1 or 0 "
        f"(true/false). Received: {name}={os.environ[name]!r}"
    )


def _env_choice(name):
    """`auto` (or unset) -> -1, a true flag -> 1, a false flag -> 0."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return -1
    try:
        return int(_env_flag(name, False))
    except ValueError:
        raise ValueError(
            f"Invalid value for environment variable {name}. Expected auto, 1 "
            f"or 0. Received: {name}={os.environ[name]!r}"
        ) from None
