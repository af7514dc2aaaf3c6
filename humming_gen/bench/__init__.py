"""The canonical benchmark (docs/BENCHMARKS.md) as a library: `run_benchmark` (run.py) times humming_gen beside
cuBLAS bf16 and Humming, report.py writes the table, JSON and plot, timing.py holds the graph timing that autotuning
shares. This module parses the command line's lists and imports no torch."""

from __future__ import annotations

from typing import Callable

DEFAULT_FORMATS = ("w4a16-int4-g128", "w3a16-int3-g128", "w8a16-int8-channel")
DEFAULT_SHAPES = ((8192, 8192),)
DEFAULT_MS = (1, 16, 64, 256, 1024, 4096, 8192)
# bench formats that are not presets: group sizes off the k step and a sign-magnitude format
EXTRA_FORMATS = {"w4a16-e0m3-g128": dict(weight="float4e0m3", group_size=128),
                 "w4a16-int4-g100": dict(weight="int4", group_size=100),
                 "w4a16-int4-g7": dict(weight="int4", group_size=7)}


def parse_ms(option: str, text: str) -> list[int]:
    """'1,16,64' -> [1, 16, 64]; ValueError naming the option and the bad item."""
    out = []
    for item in text.split(","):
        try:
            m = int(item)
        except ValueError:
            raise ValueError(f"{option}: {item.strip()!r} is not an integer (expected a comma-separated list of "
                             f"token counts such as 1,16,64)") from None
        if m < 1:
            raise ValueError(f"{option}: M = {m}; allowed: positive integers")
        out.append(m)
    return out


def ms_argument(option: str) -> Callable[[str], list[int]]:
    """parse_ms as an argparse `type`, so a bad list is argparse's usage error naming the option."""
    import argparse

    def convert(text: str) -> list[int]:
        try:
            return parse_ms(option, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def parse_shapes(option: str, text: str) -> list[tuple[int, int]]:
    """'4096x4096,14336x4096' -> [(4096, 4096), (14336, 4096)] (N x K)."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        try:
            n, k = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"{option}: {item.strip()!r} is not NxK (e.g. 4096x14336)") from None
        if n < 1 or k < 1:
            raise ValueError(f"{option}: {item.strip()!r}; N and K must be positive")
        out.append((n, k))
    return out


def parse_formats(option: str, text: str) -> list[str]:
    """Preset names (humming-gen presets) or EXTRA_FORMATS; ValueError listing what is allowed."""
    from humming_gen.schemes.presets import list_presets

    allowed = [*list_presets(), *EXTRA_FORMATS]
    out = [f.strip() for f in text.split(",") if f.strip()]
    for name in out:
        if name not in allowed:
            raise ValueError(f"{option}: unknown format {name!r}; allowed: {', '.join(allowed)}")
    if not out:
        raise ValueError(f"{option}: no format given")
    return out


def scheme_for(name: str):
    """The QuantScheme of a format name of parse_formats."""
    from humming_gen.schemes.presets import preset
    from humming_gen.schemes.scheme import QuantScheme

    return QuantScheme(**EXTRA_FORMATS[name]) if name in EXTRA_FORMATS else preset(name)
