"""sm_80 (A100) and sm_86 (GA10x: A10, A40, RTX 30): sm_75 plus bf16 MMA, cp.async and the m16n8 shapes."""

import attrs

from humming_gen.targets.sm75 import INT4_PAIRS, INT8_PAIRS, SM_75

SM_80 = attrs.evolve(
    SM_75,
    name="sm_80",
    sm=80,
    arch="sm_80",
    sm_count=108,                 # A100
    smem_per_block_optin=166912,  # 163 KB
    smem_per_sm=167936,           # 164 KB
    max_threads_per_sm=2048,
    l2_bytes=40 * 2**20,
    features=SM_75.features | {"cp_async", "mma_bf16"},
    mma_shapes={
        ("float16", "float16"): ("m16n8k16", "m16n8k8"),
        ("bfloat16", "bfloat16"): ("m16n8k16", "m16n8k8"),
        **{pair: ("m16n8k32", "m16n8k16", "m8n8k16") for pair in INT8_PAIRS},
        **{pair: ("m16n8k64", "m16n8k32", "m8n8k32") for pair in INT4_PAIRS},
    },
    predecessor="sm_75",
)

SM_86 = attrs.evolve(
    SM_80,
    name="sm_86",
    sm=86,
    arch="sm_86",
    sm_count=84,                  # A40
    smem_per_block_optin=101376,  # 99 KB
    smem_per_sm=102400,           # 100 KB
    max_threads_per_sm=1536,
    l2_bytes=6 * 2**20,
    predecessor="sm_80",
)
