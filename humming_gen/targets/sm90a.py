"""sm_90a (Hopper: H100, H200, H20): sm_89 plus wgmma, TMA (with cluster multicast), clusters, setmaxnreg.

wgmma and setmaxnreg exist only for the arch-specific "a" target, hence sm_90a rather than sm_90.
wgmma takes f16, bf16, e4m3/e5m2 and s8/u8 operands, not 4-bit integers; int4 mma.sync runs by emulation.
"""

import attrs

from humming_gen.targets.sm75 import INT4_PAIRS, INT8_PAIRS
from humming_gen.targets.sm89 import FP8_PAIRS, SM_89

WGMMA_PAIRS = (("float16", "float16"), ("bfloat16", "bfloat16")) + FP8_PAIRS + INT8_PAIRS

SM_90A = attrs.evolve(
    SM_89,
    name="sm_90a",
    sm=90,
    arch="sm_90a",
    sm_count=132,                 # H100 SXM / H200
    smem_per_block_optin=232448,  # 227 KB
    smem_per_sm=233472,           # 228 KB
    max_threads_per_sm=2048,
    l2_bytes=50 * 2**20,
    features=SM_89.features | {"tma", "tma_multicast", "wgmma", "clusters", "setmaxnreg", "pdl", "stmatrix"},
    mma_shapes={pair: shapes + (("wgmma",) if pair in WGMMA_PAIRS else ())
                for pair, shapes in SM_89.mma_shapes.items()},
    predecessor="sm_89",
    # ptxas lowers mma.sync m16n8k64 s4 to s8 IMMA here and on Blackwell (cuobjdump: IMMA.16832.S8.S8): W4A4 int4 on
    # the H200 took 38.7 / 64.6 / 3130.7 us at M = 1 / 16 / 1024 (N = K = 8192) against 19.7 / 26.5 / 211.8 with
    # int8 activations (W4A8, whose large-M buckets run wgmma)
    emulated_mma=INT4_PAIRS,
)
