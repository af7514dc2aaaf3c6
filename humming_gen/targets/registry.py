"""Name and compute-capability lookup of the built-in targets."""

from __future__ import annotations

from humming_gen.targets.sm75 import SM_75
from humming_gen.targets.sm80 import SM_80, SM_86
from humming_gen.targets.sm89 import SM_89
from humming_gen.targets.sm90a import SM_90A
from humming_gen.targets.sm100a import SM_100A, SM_103A
from humming_gen.targets.sm120a import SM_120A, SM_121A
from humming_gen.targets.target import Target
from humming_gen.targets.zhenwu810e import ZHENWU_810E

_TARGETS: dict[str, Target] = {t.name: t for t in (SM_75, SM_80, SM_86, SM_89, SM_90A, SM_100A, SM_103A, SM_120A,
                                                  SM_121A, ZHENWU_810E)}

# torch / CUDA compute capability -> target. sm_87 (Jetson Orin) shares sm_86's instructions.
CAPABILITY_TARGETS: dict[tuple[int, int], str] = {
    (7, 5): "sm_75", (8, 0): "sm_80", (8, 6): "sm_86", (8, 7): "sm_86", (8, 9): "sm_89", (9, 0): "sm_90a",
    (10, 0): "sm_100a", (10, 3): "sm_103a", (12, 0): "sm_120a", (12, 1): "sm_121a",
}

# NOTE: the PPU reports a CUDA compute capability like an NVIDIA part; its device name is what tells them
# apart. ASSUMED marker strings until checked on the device.
_ZHENWU_NAME_MARKERS = ("ppu", "zhenwu", "810e")


def get_target(name: str) -> Target:
    """The built-in target called `name` ("sm_90a", "zhenwu810e", ...); ValueError listing the names if unknown."""
    if isinstance(name, Target):
        return name
    target = _TARGETS.get(name.lower() if isinstance(name, str) else name)
    if target is None:
        raise ValueError(f"unknown target {name!r}; allowed: {', '.join(_TARGETS)}")
    return target


def list_targets() -> list[str]:
    """Names of the built-in targets, oldest first."""
    return list(_TARGETS)


def target_for_capability(major: int, minor: int, device_name: str = "") -> Target:
    """Built-in target for a compute capability (and device name, which identifies the Zhenwu PPU)."""
    if any(marker in device_name.lower() for marker in _ZHENWU_NAME_MARKERS):
        return ZHENWU_810E
    name = CAPABILITY_TARGETS.get((major, minor))
    if name is None:
        known = ", ".join(f"{ma}.{mi}" for ma, mi in CAPABILITY_TARGETS)
        raise RuntimeError(f"no humming_gen target for compute capability {major}.{minor} ({device_name!r}); "
                           f"supported: {known}")
    return _TARGETS[name]
