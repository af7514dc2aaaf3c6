"""sm_75 (Turing, e.g. T4): the base of every NVIDIA target.

fp16 mma.sync (m16n8k8 only; m16n8k16 arrived with sm_80), int8/int4 mma.sync in their m8n8 shapes, ldmatrix.
No bf16 MMA, no cp.async: shared memory is filled by plain loads.
"""

from humming_gen.targets.target import Target

INT8_PAIRS = (("int8", "int8"), ("int8", "uint8"), ("uint8", "int8"), ("uint8", "uint8"))
INT4_PAIRS = (("int4", "int4"), ("int4", "uint4"), ("uint4", "int4"), ("uint4", "uint4"))

SM_75 = Target(
    name="sm_75",
    sm=75,
    arch="sm_75",
    sm_count=40,                 # T4
    smem_per_block_optin=65536,  # 64 KB
    smem_per_sm=65536,
    max_threads_per_sm=1024,
    l2_bytes=4 * 2**20,
    features={"ldmatrix", "mma_int8", "mma_int4"},
    mma_shapes={
        ("float16", "float16"): ("m16n8k8",),
        **{pair: ("m8n8k16",) for pair in INT8_PAIRS},
        **{pair: ("m8n8k32",) for pair in INT4_PAIRS},
    },
)
