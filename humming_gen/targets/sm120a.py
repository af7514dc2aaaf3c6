"""sm_120a (RTX PRO 6000 Blackwell, RTX 50) and sm_121a (GB10 / DGX Spark): Blackwell without tcgen05.

Tensor cores are driven by mma.sync only (no wgmma, no tcgen05), but mma.sync gains fp4 operands and
block-scaled kinds: MXFP8 / MXFP4 / NVFP4 (m16n8k64 for fp4 x fp4 with scales, m16n8k32 for f8f6f4 pairs).
TMA and clusters exist; TMA multicast does not.
"""

import attrs

from humming_gen.targets.sm100a import SM_100A

_F8F4 = ("float8e4m3", "float8e5m2", "float4e2m1")
_FP4_MMA_SYNC = {(a, b): ("m16n8k32",) for a in _F8F4 for b in _F8F4 if "float4e2m1" in (a, b)}
_FP4_MMA_SYNC[("float4e2m1", "float4e2m1")] = ("m16n8k64", "m16n8k32")


def _mma_sync_only(shapes) -> dict:
    out = {pair: tuple(s for s in v if s != "tcgen05") for pair, v in shapes.items()}
    return {pair: v for pair, v in out.items() if v}


SM_120A = attrs.evolve(
    SM_100A,
    name="sm_120a",
    sm=120,
    arch="sm_120a",
    sm_count=188,                 # RTX PRO 6000 Blackwell (RTX 5090: 170)
    smem_per_block_optin=101376,  # 99 KB
    smem_per_sm=102400,
    max_threads_per_sm=1536,
    l2_bytes=128 * 2**20,
    features=SM_100A.features - {"tcgen05", "tcgen05_int8", "tma_multicast"},
    mma_shapes={**_mma_sync_only(SM_100A.mma_shapes), **_FP4_MMA_SYNC},
    predecessor="sm_100a",
)

SM_121A = attrs.evolve(
    SM_120A,
    name="sm_121a",
    sm=121,
    arch="sm_121a",
    sm_count=48,                  # GB10 (DGX Spark)
    l2_bytes=24 * 2**20,
    predecessor="sm_120a",
)
