"""zhenwu810e (T-Head Zhenwu 810E PPU): CUDA-compatible and SM80-like, with its own instruction variants.

It uses ppu.-prefixed mma (N=16, accumulator fragments ordered N before M), ldmatrix with swizzle and a bulk
tensor copy (feature "ppu_variants"); 256 KB of shared memory; no int4 MMA; its own compiler driver.
Nothing here can run or compile for it on our machines, so every number below not stated in docs/DESIGN.md is an
ASSUMPTION, marked as such; replace them with measured values (Target.current() does so on the device).
"""

import attrs

from humming_gen.targets.sm80 import SM_80

ZHENWU_810E = attrs.evolve(
    SM_80,
    name="zhenwu810e",
    sm=80,                        # ASSUMED: reports an SM80-like compute capability
    arch="zhenwu810e",            # ASSUMED placeholder: its compiler driver's architecture flag is unknown here
    sm_count=108,                 # ASSUMED (A100-like); not published
    smem_per_block_optin=262144,  # 256 KB (docs/DESIGN.md)
    smem_per_sm=262144,           # 256 KB (docs/DESIGN.md)
    max_threads_per_sm=2048,      # ASSUMED (SM80-like)
    l2_bytes=40 * 2**20,          # ASSUMED (A100-like); not published
    # No int4 MMA (docs/DESIGN.md). int8 MMA is left out until confirmed: a missing feature falls back to 16-bit
    # activations, a wrongly claimed one produces kernels its compiler rejects.
    features=(SM_80.features - {"mma_int4", "mma_int8"}) | {"ppu_variants"},
    mma_shapes={
        ("float16", "float16"): ("ppu_m16n16k16",),
        ("bfloat16", "bfloat16"): ("ppu_m16n16k16",),
    },
    predecessor="sm_80",
)
