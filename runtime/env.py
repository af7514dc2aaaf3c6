"""The ``HUMMING_GEN_*`` environment switches of the runtime, read in one place.

Each switch is read at call time, not at import, so a test or a long-lived process can change it.

| variable                 | effect                                                              |
| ------------------------ | ------------------------------------------------------------------- |
| HUMMING_GEN_CACHE_DIR    | disk cache directory (default ``~/.cache/humming_gen``)              |
| HUMMING_GEN_COMPILER     | default compiler, ``nvrtc`` or ``nvcc`` (default ``nvrtc``)          |
| HUMMING_GEN_DEBUG        | ``1``: line info (-lineinfo) and device asserts kept                 |
| HUMMING_GEN_NO_CACHE     | ``1``: no disk cache (the in-memory cache still works)               |
| HUMMING_GEN_DUMP         | ``1``: PTX and SASS written beside each disk cache entry              |
"""

from __future__ import annotations

import os
from pathlib import Path

_FALSE = ("", "0", "false", "no", "off")


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
