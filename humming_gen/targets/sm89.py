"""sm_89 (Ada: L4, L40, RTX 40): sm_86 plus e4m3/e5m2 mma.sync and fp32 -> fp8 conversion instructions."""

import attrs

from humming_gen.targets.sm80 import SM_86

FP8_PAIRS = (("float8e4m3", "float8e4m3"), ("float8e4m3", "float8e5m2"), ("float8e5m2", "float8e4m3"),
             ("float8e5m2", "float8e5m2"))

SM_89 = attrs.evolve(
    SM_86,
    name="sm_89",
    sm=89,
    arch="sm_89",
    sm_count=128,                 # RTX 4090 (L40 / L40S: 142, L4: 58)
    l2_bytes=72 * 2**20,
    features=SM_86.features | {"mma_fp8", "cvt_fp8"},
    mma_shapes={**SM_86.mma_shapes, **{pair: ("m16n8k32",) for pair in FP8_PAIRS}},
    predecessor="sm_86",
)
