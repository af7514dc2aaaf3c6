"""sm_100a (B200, GB200) and sm_103a (B300, GB300): tcgen05 (UMMA) with tensor memory and MX block scaling.

wgmma is gone (it is sm_90a only); mma.sync, TMA, clusters and setmaxnreg remain. tcgen05.mma multiplies f16,
bf16, any pair of e4m3/e5m2/e2m1 (kind::f8f6f4), s8/u8 (kind::i8), and block-scaled MXFP8/MXFP4/NVFP4.
sm_103a's tcgen05 has no kind::i8.
"""

import attrs

from humming_gen.targets.sm75 import INT8_PAIRS
from humming_gen.targets.sm90a import SM_90A

_F8F6F4 = ("float8e4m3", "float8e5m2", "float4e2m1")
UMMA_PAIRS = ((("float16", "float16"), ("bfloat16", "bfloat16")) + tuple((a, b) for a in _F8F6F4 for b in _F8F6F4)
              + INT8_PAIRS)


def _with_umma(shapes: dict, pairs) -> dict:
    """mma.sync shapes without wgmma, plus tcgen05 for every pair UMMA multiplies."""
    out = {pair: tuple(s for s in v if s != "wgmma") for pair, v in shapes.items()}
    for pair in pairs:
        out[pair] = out.get(pair, ()) + ("tcgen05",)
    return out


SM_100A = attrs.evolve(
    SM_90A,
    name="sm_100a",
    sm=100,
    arch="sm_100a",
    sm_count=148,                 # B200
    smem_per_block_optin=232448,  # 227 KB
    smem_per_sm=233472,
    l2_bytes=126 * 2**20,
    features=(SM_90A.features - {"wgmma"}) | {"tcgen05", "tcgen05_int8", "mx_block_scale", "cvt_fp4"},
    mma_shapes=_with_umma(dict(SM_90A.mma_shapes), UMMA_PAIRS),
    predecessor="sm_90a",
)

SM_103A = attrs.evolve(
    SM_100A,
    name="sm_103a",
    sm=103,
    arch="sm_103a",
    sm_count=148,                 # B300
    features=SM_100A.features - {"tcgen05_int8"},
    mma_shapes={pair: tuple(s for s in v if not (s == "tcgen05" and pair in INT8_PAIRS))
                for pair, v in SM_100A.mma_shapes.items()},
    predecessor="sm_100a",
)
