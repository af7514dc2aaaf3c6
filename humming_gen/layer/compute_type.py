"""Which compute type a layer runs a scheme with quantized activations on a given target.

Humming's promise, kept here: one checkpoint runs on every GPU generation. Where the target has no MMA for the
scheme's activation type (fp4 on sm_90a, fp8 on sm_80, int8 where absent), or the kernels cannot serve the
scheme's activation quantization there, or the target only emulates that MMA (int4 from sm_90a on), the layer falls
back to the next supported compute type with the weights unchanged: fp4 / int4 activations -> 8-bit (fp8 e4m3 or
int8, per token, dynamic) -> the layer's 16-bit dtype (weight-only). The choice is logged once per (scheme, target,
result) and exposed as `layer.compute_dtype`; strict=True refuses instead, naming what is missing (or, for an
emulated MMA, runs it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import attrs

from humming_gen.schemes import ActivationScheme, QuantScheme

if TYPE_CHECKING:
    from humming_gen.config import ComputeConfig
    from humming_gen.targets import Target

logger = logging.getLogger("humming_gen")
_LOGGED: set[tuple[str, str, str]] = set()


@attrs.frozen
class ComputeChoice:
    scheme: QuantScheme     # the scheme the kernels run: the weights' own, with the activation it will quantize
    compute_dtype: str      # activation type the MMA multiplies: e.g. "float8e4m3", "int8", "bfloat16"
    reasons: tuple[str, ...]  # why the scheme's own activation type does not run here (empty when it does)


def kernel_reasons(n: int, k: int, scheme: QuantScheme, compute: "ComputeConfig", target: "Target",
                   **layer: object) -> list[str]:
    """What keeps the standard pipeline's kernels from serving `scheme` for an (N, K) GEMM on `target` (the pipeline
    of every target; empty: served). A scheme whose activation groups do not tile K has no kernel: a reason too."""
    from humming_gen.config import LayerConfig
    from humming_gen.pipelines.standard import STANDARD

    try:
        config = LayerConfig(n=n, k=k, scheme=scheme, **layer)
    except ValueError as e:
        return [str(e)]
    return STANDARD.supports(config, compute, target)


def eight_bit_fallback(act: ActivationScheme) -> ActivationScheme | None:
    """The 8-bit activation scheme a narrower one falls back to (per token, dynamic), None for 8-bit schemes."""
    if act.dtype.bits >= 8:
        return None
    return ActivationScheme("float8e4m3" if act.dtype.is_float else "int8", granularity="token")


def resolve(scheme: QuantScheme, dtype_name: str, target_name: str, reasons_for: Callable[[QuantScheme], list[str]],
            *, strict: bool, weight_only: bool, who: str, log: bool = True,
            emulated_mma: frozenset[tuple[str, str]] = frozenset()) -> ComputeChoice:
    """The scheme to run. `reasons_for(s)` lists what keeps kernels from serving s on the target (empty: served).
    When even 16-bit activations have reasons, the choice is 16-bit with them (the caller's compose names them).
    Activations whose MMA the target only emulates (Target.emulated_mma) fall back too, unless strict."""
    act = scheme.activation
    if act is None:
        return ComputeChoice(scheme, dtype_name, ())
    if weight_only:
        return ComputeChoice(attrs.evolve(scheme, activation=None), dtype_name, ())
    reasons = tuple(reasons_for(scheme))
    emulated = not reasons and not strict and (act.dtype.name, act.dtype.name) in emulated_mma
    if emulated:
        reasons = (f"{target_name} has no {act.dtype.name} tensor cores: ptxas emulates its mma.sync, slower than "
                   f"the next compute type",)
    if not reasons:
        return ComputeChoice(scheme, act.dtype.name, ())
    if strict:
        raise ValueError(
            f"the scheme quantizes activations ({act.dtype.name}, {act.granularity}), which kernels on {target_name} "
            f"cannot serve:\n  - " + "\n  - ".join(reasons)
            + f"\nstrict=True refuses; without it the layer falls back to 8-bit or {dtype_name} activations, or pass "
              f"weight_only=True to run the weights with {dtype_name} activations")
    choice = None
    wider = eight_bit_fallback(act)
    if wider is not None:
        candidate = attrs.evolve(scheme, activation=wider)
        if not reasons_for(candidate):
            choice = ComputeChoice(candidate, wider.dtype.name, reasons)
    if choice is None:
        choice = ComputeChoice(attrs.evolve(scheme, activation=None), dtype_name, reasons)
    key = (repr(scheme), target_name, choice.compute_dtype)
    if log and key not in _LOGGED:
        _LOGGED.add(key)
        logger.warning("%s: %s activations of this scheme do not run on %s (%s); running %s activations with the "
                       "weights unchanged (strict=True %s instead)", who, act.dtype.name, target_name,
                       reasons[0], choice.compute_dtype, "runs the emulation" if emulated else "refuses")
    return choice
