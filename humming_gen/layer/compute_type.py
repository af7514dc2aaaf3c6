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


def dequantized_activations_default(act: ActivationScheme, dtype_name: str, target: "Target") -> bool:
    """Whether a layer runs `act`'s quantized values on the 16-bit kernels unless told otherwise: fp8 activations in
    groups shorter than 128 (MXFP8, fp8 group-32) on sm_90a, in a bf16 layer, where the 8-bit kernels promote fp32
    partial sums every group (an FFMA per partial sum and k32 step, as many issue slots as the tensor cores' time:
    README, group-32 case). With e8m0 scales (MXFP8) the values are exact in bf16 (a code of at most 4 significant
    bits times a power of two), so the 16-bit GEMM computes the quantized GEMM's products with fp32 accumulation;
    with fp32 (or 16-bit) scales each value is rounded to bf16, 2^-9 relative at most, a thirtieth of the fp8
    quantization's own 2^-4, as x itself was bf16 (relative error of the output against the float64 reference of the
    quantized GEMM: 2.2e-3 against the 8-bit kernels' 1.7e-3, the bf16 output rounding most of both).
    H200, graph us with the quantization, 8-bit kernels / 16-bit values (bench/dequantized_route.py, 2026-12-04):

    | weights x activations, N x K | M = 1 | 16 | 64 | 256 | 1024 | 4096 |
    |---|---|---|---|---|---|---|
    | MXFP4 x MXFP8, 3072 x 4096 | 9.8 / 10.5 | 11.1 / 13.6 | 17.5 / 16.6 | 36.7 / 26.9 | 105.8 / 61.2 | 321.0 / 193.4 |
    | the same, 14336 x 4096 | 21.0 / 19.4 | 23.2 / 22.2 | 36.0 / 32.5 | 101.2 / 57.5 | 340.2 / 213.1 | 1343 / 793.1 |
    | the same, 8192 x 8192 | 23.0 / 20.1 | 28.3 / 23.2 | 40.8 / 32.4 | 102.7 / 67.8 | 389.2 / 214.3 | 1530 / 871.2 |
    | w8a8-mxfp8, 3072 x 4096 | 9.4 / 14.6 | 10.6 / 14.6 | 17.0 / 17.3 | 36.0 / 27.6 | 122.4 / 60.7 | 368.1 / 188.8 |
    | the same, 14336 x 4096 | 23.5 / 23.7 | 24.1 / 26.5 | 36.2 / 33.9 | 117.8 / 58.0 | 394.2 / 216.2 | 1542 / 837.1 |
    | the same, 8192 x 8192 | 27.2 / 24.5 | 30.6 / 27.3 | 41.9 / 34.6 | 117.2 / 70.9 | 451.5 / 217.9 | 1774 / 893.1 |
    | MXFP4 x fp8 g32, 3072 x 4096 | 9.4 / 10.4 | 10.7 / 13.2 | 16.1 / 16.1 | 34.0 / 26.5 | 102.6 / 60.4 | 310.2 / 196.3 |
    | the same, 14336 x 4096 | 20.5 / 19.8 | 22.3 / 22.5 | 34.3 / 32.7 | 100.9 / 58.1 | 336.6 / 215.6 | 1323 / 797.4 |
    | the same, 8192 x 8192 | 23.0 / 20.6 | 27.9 / 23.5 | 39.5 / 32.8 | 100.5 / 68.7 | 384.0 / 214.7 | 1512 / 920.6 |

    Faster from M = 256 on every shape (1.5-2.1x from M = 1024), level at M = 64 (17.0 / 17.3 the worst), slower
    at M <= 16 on 3072 x 4096 (up to 5.2 us for 8-bit weights, whose 16-bit kernels there are slower) and on
    14336 x 4096 with 8-bit weights (up to 2.4 us): a layer holds one packed weight, so the choice is per layer.
    int8 group activations (unmeasured; their 7-bit codes times a scale are not exact in bf16) keep the 8-bit
    kernels."""
    return (act.granularity == "group" and act.group_size < 128 and act.dtype.is_float and act.dtype.bits == 8
            and not act.global_scale and dtype_name == "bfloat16" and target.has("wgmma"))


def value_activation_scheme(scheme: QuantScheme, dtype_name: str, target: "Target",
                            dequantize_activations: bool | None, *, weight_only: bool, quantize_in_gemm: bool,
                            batch_invariant: bool, strict: bool = False, tunings_given: bool = False,
                            static_scale: bool = False, who: str = "QuantLinear") -> ActivationScheme | None:
    """The activation scheme a layer quantizes x with and then runs as 16-bit values (fake_quantize_activation) on
    the 16-bit kernels, or None where it runs the 8-bit kernels (or weight-only). dequantize_activations: True
    always (any target: only the quantization kernel and the 16-bit GEMMs are needed; values that are not exact in
    the layer's dtype are rounded to it), False never, None where `dequantized_activations_default` says so and the
    caller did not pin the kernels (strict=True: the scheme's own activations; explicit tunings: chosen for the
    8-bit kernels; quantize_in_gemm, batch_invariant, weight_only). ValueError where True cannot be honoured."""
    from humming_gen.activation.kernel import scheme_problems

    act = scheme.activation
    if dequantize_activations is None:
        if (act is None or weight_only or quantize_in_gemm or batch_invariant or strict or tunings_given
                or scheme_problems(act)):
            return None
        if not dequantized_activations_default(act, dtype_name, target):
            return None
        key = (repr(scheme), target.name, "values")
        if key not in _LOGGED:
            _LOGGED.add(key)
            logger.info("%s: %s activations in groups of %d run as bf16 values on the 16-bit kernels on %s "
                        "(dequantize_activations=False runs the 8-bit kernels)", who, act.dtype.name,
                        act.group_size, target.name)
        return act
    if not isinstance(dequantize_activations, bool):
        raise TypeError(f"dequantize_activations must be True, False or None, got {dequantize_activations!r}")
    if not dequantize_activations:
        return None
    problems = []
    if act is None:
        problems.append(f"the scheme ({scheme.summary()}) does not quantize activations")
    elif act.global_scale:
        problems.append("activation schemes with a global scale (NVFP4) have no 16-bit value kernel")
    elif scheme_problems(act):
        problems += scheme_problems(act)
    elif batch_invariant and act.granularity == "tensor" and not static_scale:
        problems.append("batch_invariant=True with a dynamic per-tensor activation scale (the amax over every row "
                        "of the batch)")
    if weight_only:
        problems.append("weight_only=True runs unquantized 16-bit activations")
    if quantize_in_gemm:
        problems.append("quantize_in_gemm=True runs 8-bit kernels")
    if problems:
        raise ValueError("dequantize_activations=True: " + "; ".join(problems))
    return act
