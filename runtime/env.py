"""The ``HUMMING_GEN_*`` environment switches of the runtime, read in one place.

Each switch is read at call time, not at import, so a test or a long-lived process can change it.

| variable                 | effect                                                              |
| ------------------------ | ------------------------------------------------------------------- |
| HUMMING_GEN_CACHE_DIR    | disk cache directory (default ``~/.cache/humming_gen``)              |
| HUMMING_GEN_COMPILER     | default compiler, ``nvrtc`` or ``nvcc`` (default ``nvrtc``)          |
| HUMMING_GEN_DEBUG        | ``1``: line info (-lineinfo) and device asserts kept                 |
| HUMMING_GEN_NO_CACHE     | ``1``: no disk cache (the in-memory cache still works)               |
| HUMMING_GEN_DUMP         | ``1``: PTX and SASS written beside each disk cache entry              |
| HUMMING_GEN_CACHE_MAX_BYTES | disk cache size cap (default 2G; ``0``: no cap), least recently used out |
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_FALSE = ("", "0", "false", "no", "off")

#: Default size cap of the disk cache (2 GiB).
DEFAULT_CACHE_MAX_BYTES = 2 * 1024**3

_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in _FALSE


def cache_dir() -> Path:
    """Directory of the disk cache; a user-level default so kernels survive across processes."""
    value = os.environ.get("HUMMING_GEN_CACHE_DIR", "").strip()
    if value:
        return Path(value).expanduser()
    return Path.home() / ".cache" / "humming_gen"


def default_compiler() -> str:
    """Compiler used when a caller names none (``nvrtc`` unless ``HUMMING_GEN_COMPILER`` says otherwise)."""
    return os.environ.get("HUMMING_GEN_COMPILER", "").strip().lower() or "nvrtc"


def debug() -> bool:
    """Whether kernels are built with line info and device asserts (for compute-sanitizer, cuda-gdb)."""
    return _flag("HUMMING_GEN_DEBUG")


def no_cache() -> bool:
    """Whether the disk cache is switched off (every new process compiles again)."""
    return _flag("HUMMING_GEN_NO_CACHE")


def dump() -> bool:
    """Whether PTX and SASS are written beside each cache entry, for reading the generated code."""
    return _flag("HUMMING_GEN_DUMP")


def cache_max_bytes() -> int:
    """Size cap of the disk cache in bytes (``HUMMING_GEN_CACHE_MAX_BYTES``; 0 means no cap).

    Accepts a number of bytes with an optional K, M, G or T suffix (powers of 1024), e.g. ``500M``.
    """
    value = os.environ.get("HUMMING_GEN_CACHE_MAX_BYTES", "").strip()
    if not value:
        return DEFAULT_CACHE_MAX_BYTES
    match = _SIZE.fullmatch(value)
    if match is None:
        raise ValueError(
            f"HUMMING_GEN_CACHE_MAX_BYTES={value!r} is not a size; allowed: a number of bytes with an optional "
            "K, M, G or T suffix (e.g. 2147483648, 500M, 2G), or 0 for no cap"
        )
    return int(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_")
