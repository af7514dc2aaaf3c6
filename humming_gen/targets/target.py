"""`Target`: one device kind as data (SM version, resources, features, MMA instructions per dtype pair).

Code outside `targets/` and `heuristics/` asks a Target what it has (`has`, `require`, `supports_mma`)
instead of comparing SM numbers, so a new target is one new module here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from humming_gen.config.tuning import MMAS

# Everything a component may require. Baseline fp16 mma.sync is not listed: every target has it.
FEATURES = frozenset({
    "cp_async",        # cp.async global->shared copies (sm_80+)
    "ldmatrix",        # ldmatrix shared->register fragment loads
    "stmatrix",        # stmatrix register fragments->shared (sm_90+)
    "mma_bf16",        # bf16 mma.sync (sm_80+)
    "mma_fp8",         # e4m3/e5m2 mma.sync (sm_89+)
    "cvt_fp8",         # cvt.rn.satfinite.{e4m3,e5m2}x2.f32: fp32 -> fp8 pair conversion (sm_89+)
    "cvt_fp4",         # cvt.rn.satfinite.e2m1x2.f32: fp32 -> fp4 pair conversion (sm_100a, sm_103a, sm_120a, sm_121a)
    "mma_int8",        # s8/u8 mma.sync
    "mma_int4",        # s4/u4 mma.sync
    "tma",             # cp.async.bulk.tensor with mbarrier completion
    "tma_multicast",   # TMA .multicast::cluster (sm_90a, sm_100a/103a; not sm_120a)
    "wgmma",           # warpgroup MMA (sm_90a only)
    "clusters",        # thread block clusters, distributed shared memory
    "setmaxnreg",      # per-warpgroup register reallocation
    "pdl",             # programmatic dependent launch: griddepcontrol.wait / launch_dependents (sm_90+)
    "tcgen05",         # Blackwell UMMA with tensor memory
    "tcgen05_int8",    # tcgen05.mma kind::i8 (sm_100a; not sm_103a)
    "mx_block_scale",  # MMA applies e8m0 / e4m3 block scales itself (MXFP8, MXFP4, NVFP4)
    "ppu_variants",    # Zhenwu PPU: ppu.-prefixed mma / ldmatrix / bulk copy, N=16 mma, N-before-M fragments
})

# Exact wider formats of the same kind that an activation may be widened to before falling back to 16 bits.
_WIDER_SAME_KIND = {True: ("float8e4m3",), False: ("int8",)}


def _shapes_table(value: Mapping[tuple[str, str], Iterable[str]]) -> Mapping[tuple[str, str], tuple[str, ...]]:
    """Read-only copy with sorted keys, so two targets built from the same data compare and print alike."""
    return MappingProxyType({tuple(k): tuple(v) for k, v in sorted(value.items())})


def _dtype_name(name: Any) -> str:
    from humming_gen.formats import dtype

    return dtype(name).name


@attrs.frozen(kw_only=True)
class Target:
    """One device kind.

    name: public spelling ("sm_90a", "zhenwu810e"). sm: SM version as an int (90, 103, ...).
    arch: the compiler's architecture string. sm_count, smem_*, l2_bytes: a representative part of the family,
    replaced by the real device's values in `Target.current()`.
    mma_shapes: (a dtype, b dtype) -> MMA instructions in TuningConfig.mma spelling, best first. Fixed-shape
    mma.sync names ("m16n8k16") and the asynchronous MMAs ("wgmma", "tcgen05") are both listed, so the table
    answers "can this target multiply these formats on tensor cores, and how".
    predecessor: the target this one was derived from (attrs.evolve), for documentation and tests.
    """

    name: str
    sm: int
    arch: str
    sm_count: int
    smem_per_block_optin: int
    smem_per_sm: int
    regs_per_sm: int = 65536
    max_threads_per_sm: int
    l2_bytes: int
    features: frozenset[str] = attrs.field(converter=frozenset)
    mma_shapes: Mapping[tuple[str, str], tuple[str, ...]] = attrs.field(converter=_shapes_table, hash=False)
    predecessor: str | None = None
    #: (a, b) pairs the target multiplies with mma.sync that ptxas lowers to other units (int4 from sm_90a on: no int4
    #: tensor cores): exact, but slower than the next compute type, so layers fall back from them unless strict
    emulated_mma: frozenset[tuple[str, str]] = attrs.field(factory=frozenset, converter=frozenset)

    def __attrs_post_init__(self) -> None:
        unknown = sorted(self.features - FEATURES)
        if unknown:
            raise ValueError(f"Target {self.name}: unknown features {unknown}; allowed: {sorted(FEATURES)}")
        for pair, shapes in self.mma_shapes.items():
            bad = [s for s in shapes if s not in MMAS]
            if len(pair) != 2 or not shapes or bad:
                raise ValueError(f"Target {self.name}: mma_shapes[{pair}] = {shapes}; allowed: a (a, b) dtype "
                                 f"pair -> a non-empty tuple of {MMAS}")
        for name in ("sm_count", "smem_per_block_optin", "smem_per_sm", "regs_per_sm", "max_threads_per_sm",
                     "l2_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Target {self.name}: {name} must be a positive int, got {value!r}")

    # --- queries ------------------------------------------------------------------------------
    def has(self, feature: str) -> bool:
        """True when the target has `feature`; an unknown feature name is a typo and raises ValueError."""
        if feature not in FEATURES:
            raise ValueError(f"unknown target feature {feature!r}; allowed: {sorted(FEATURES)}")
        return feature in self.features

    def require(self, features: Iterable[str], what: str) -> None:
        """Raise ValueError naming `what`, the features it needs that this target lacks, and the target."""
        features = [features] if isinstance(features, str) else list(features)
        missing = sorted({f for f in features if not self.has(f)})
        if missing:
            raise ValueError(f"{what} needs {', '.join(missing)}, which target {self.name} does not have "
                             f"(it has: {', '.join(sorted(self.features)) or 'none'})")

    def mma_instructions(self, a: str, b: str) -> tuple[str, ...]:
        """MMA instructions for a (a x b) product, best first; () when there is none. Accepts dtype aliases."""
        return self.mma_shapes.get((_dtype_name(a), _dtype_name(b)), ())

    def supports_mma(self, a: str, b: str) -> bool:
        """True when tensor cores multiply a-format by b-format operands directly."""
        return bool(self.mma_instructions(a, b))

    def activation_compute_dtype(self, act: str) -> tuple[str, str | None]:
        """Format in which activations of format `act` enter the MMA here, and why when it is not `act`.

        Rule: when the target has no (act x act) MMA, widen to the next higher precision it has that holds
        every `act` value exactly (fp4/fp6 -> float8e4m3, int4 -> int8), else to 16 bits (bfloat16 when
        the target has bf16 MMA, else float16). Returns (dtype name, None) when no fallback was needed.
        """
        from humming_gen.formats import dtype

        d = dtype(act)
        if d.bits > 16:
            raise ValueError(f"activation_compute_dtype: act={d.name!r} has {d.bits} bits; allowed: formats of "
                             f"<= 16 bits")
        sixteen = "bfloat16" if self.has("mma_bf16") else "float16"
        ladder = [d.name]
        if d.bits < 16:
            ladder += [w for w in _WIDER_SAME_KIND[d.is_float] if dtype(w).bits > d.bits and dtype(w).represents(d)]
        for candidate in ladder:
            if self.supports_mma(candidate, candidate):
                if candidate == d.name:
                    return d.name, None
                return candidate, self._fallback_reason(d.name, candidate)
        # 16 bits is the last resort: every target has float16 MMA, and bfloat16 where mma_bf16 says so.
        chosen = "float16" if d.name == "float16" else sixteen
        if chosen == d.name:
            return chosen, None
        return chosen, self._fallback_reason(d.name, chosen)

    def _fallback_reason(self, act: str, chosen: str) -> str:
        from humming_gen.formats import dtype

        exact = ("exact: every value fits" if dtype(chosen).represents(dtype(act))
                 else f"not exact: {act} values outside {chosen}'s range or precision are rounded")
        return f"target {self.name} has no {act} x {act} MMA; activations are computed in {chosen} ({exact})"

    def summary(self) -> str:
        """One line for the generated source's header."""
        return (f"target  {self.name} arch={self.arch} sms={self.sm_count} smem_optin={self.smem_per_block_optin} "
                f"features=[{','.join(sorted(self.features))}]")

    # --- the device torch is using ------------------------------------------------------------
    @classmethod
    def current(cls, device: Any = None) -> "Target":
        """Target of the current (or given) torch CUDA device, with its measured SM count, memory and L2.

        Raises RuntimeError when torch sees no CUDA device or its compute capability has no target.
        """
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("Target.current(): torch sees no CUDA device (torch.cuda.is_available() is False); "
                               "pass the target by name instead: target='sm_90a' (with device='cpu' to build a "
                               "layer on the CPU), or humming_gen.get_target('sm_90a')")
        index = torch.cuda.current_device() if device is None else torch.device(device).index
        props = torch.cuda.get_device_properties(0 if index is None else index)
        return cls.from_device_properties(props)

    @classmethod
    def from_device_properties(cls, props: Any) -> "Target":
        """Target for torch device properties (major, minor, name, multi_processor_count, ...).

        Separate from `current()` so the capability mapping is testable without a GPU.
        """
        from humming_gen.targets.registry import target_for_capability

        base = target_for_capability(props.major, props.minor, getattr(props, "name", ""))

        def measured(attr: str, default: int) -> int:
            value = getattr(props, attr, None)
            return int(value) if isinstance(value, int) and value > 0 else default

        return attrs.evolve(
            base,
            sm_count=measured("multi_processor_count", base.sm_count),
            smem_per_block_optin=measured("shared_memory_per_block_optin", base.smem_per_block_optin),
            smem_per_sm=measured("shared_memory_per_multiprocessor", base.smem_per_sm),
            regs_per_sm=measured("regs_per_multiprocessor", base.regs_per_sm),
            max_threads_per_sm=measured("max_threads_per_multi_processor", base.max_threads_per_sm),
            l2_bytes=measured("L2_cache_size", base.l2_bytes),
        )
