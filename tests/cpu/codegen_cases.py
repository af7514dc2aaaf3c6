"""Case generator for the code-generator tests: (LayerConfig, TuningConfig) pairs across formats, scale
granularities, activation dtypes, bias and tunings, plus small helpers that read generated sources.

A case either names an explicit TuningConfig or an M whose heuristic bucket supplies the tuning, resolved per
target (`Case.tuning_for`), so one case composes on every target whatever its shared memory. Ids read like
the config (`w4a16-int4-g128-bf16-m1`). test_numeric_emulation.py reuses the registered custom format.
"""

from __future__ import annotations

import re

import attrs

from humming_gen.codegen.compose import KernelPlan, compose
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.formats import FloatType, register_dtype
from humming_gen.heuristics import choose_tunings
from humming_gen.schemes import QuantScheme
from humming_gen.targets import Target, get_target

# A custom ExMy format registered from Python: it must go through exactly the same path as a built-in one.
CUSTOM_FLOAT_NAME = "hg_test_e2m2"
CUSTOM_FLOAT = register_dtype(CUSTOM_FLOAT_NAME, FloatType(2, 2))

COMPILE_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")
COMPOSE_TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a")


@attrs.frozen
class Case:
    """One kernel of the matrix: a layer, and either an explicit tuning or the heuristic bucket of `m`."""

    id: str
    layer: LayerConfig
    tuning: TuningConfig | None = None
    m: int = 1

    def tuning_for(self, target: Target) -> TuningConfig:
        if self.tuning is not None:
            return self.tuning
        return choose_tunings(self.layer, target).for_m(self.m)

    def plan(self, target: "Target | str", compute: ComputeConfig | None = None) -> KernelPlan:
        tgt = get_target(target) if isinstance(target, str) else target
        return compose(self.layer, compute or ComputeConfig(), self.tuning_for(tgt), tgt)


def _scheme(weight, granularity: str, group_size: int | None = None, block=None, scale_dtype="bfloat16",
            zero_point=None, global_scale=False) -> QuantScheme:
    kwargs = {}
    if granularity == "group":
        kwargs["group_size"] = group_size
    if granularity == "block":
        kwargs["block_size"] = block
    return QuantScheme(weight, granularity=granularity, scale_dtype=scale_dtype, zero_point=zero_point,
                       global_scale=global_scale, **kwargs)


def _gran_id(s: QuantScheme) -> str:
    if s.granularity == "group":
        return f"g{s.group_size}"
    if s.granularity == "block":
        return f"b{s.block_size[0]}x{s.block_size[1]}"
    return {"channel": "ch", "tensor": "t"}[s.granularity]


_DT = {"bfloat16": "bf16", "float16": "fp16"}

# Explicit tunings: split-K with warps_k, several warps along m, a narrow 64-wide n block, an odd number of m8
# tiles per warp, four m warps, a 256-wide n block.
T_SPLITK = TuningConfig(block_m=16, block_n=128, block_k=128, warps_m=1, warps_n=2, warps_k=2, stages=4, split_k=3)
T_WARPS_M2 = TuningConfig(block_m=64, block_n=128, block_k=64, warps_m=2, warps_n=2, warps_k=1, stages=3)
T_NARROW = TuningConfig(block_m=16, block_n=64, block_k=128, warps_m=1, warps_n=1, warps_k=2, stages=4, split_k=2)
T_ODD_M = TuningConfig(block_m=24, block_n=128, block_k=128, warps_m=1, warps_n=2, warps_k=2, stages=3)
T_WARPS_M4 = TuningConfig(block_m=128, block_n=64, block_k=64, warps_m=4, warps_n=1, warps_k=1, stages=3)
T_WIDE = TuningConfig(block_m=32, block_n=256, block_k=64, warps_m=1, warps_n=4, warps_k=1, stages=3)
T_WARP_K128 = TuningConfig(block_m=8, block_n=64, block_k=256, warps_m=1, warps_n=2, warps_k=2, stages=3, split_k=4)


def _case(weight, granularity, *, group_size=None, block=None, scale_dtype="bfloat16", zero_point=None,
          global_scale=False, dtype="bfloat16", bias=False, n=4096, k=4096, m=1, tuning=None, out_dtype=None,
          tag="") -> Case:
    s = _scheme(weight, granularity, group_size, block, scale_dtype, zero_point, global_scale)
    layer = LayerConfig(n, k, s, has_bias=bias, dtype=dtype, **({"out_dtype": out_dtype} if out_dtype else {}))
    wname = s.weight.name
    parts = [f"w{s.weight.bits}a16", wname, _gran_id(s)]
    if zero_point:
        parts.append(f"zp{zero_point}")
    if global_scale:
        parts.append("gs")
    if scale_dtype != "bfloat16":
        parts.append(f"s{scale_dtype.replace('float', 'f')}")
    parts.append(_DT[dtype])
    if out_dtype:
        parts.append(f"out{out_dtype.replace('float', 'f')}")
    if bias:
        parts.append("bias")
    if (n, k) != (4096, 4096):
        parts.append(f"n{n}k{k}")
    parts.append(tag or (f"m{m}" if tuning is None else "explicit"))
    return Case(id="-".join(parts), layer=layer, tuning=tuning, m=m)


def codegen_cases() -> list[Case]:
    """The matrix (>= 30 kernels). Ids are unique and stable; the order is fixed."""
    c = _case
    cases = [
        # int4 g128 bf16 across the heuristic buckets of one shape (decode .. prefill)
        c("int4", "group", group_size=128, m=1),
        c("int4", "group", group_size=128, m=16),
        c("int4", "group", group_size=128, m=64),
        c("int4", "group", group_size=128, m=4096),
        c("int4", "group", group_size=128, dtype="float16", bias=True, n=4000, k=3000, m=1),
        # every int width
        c("int1", "channel"),
        c("int2", "group", group_size=64, dtype="float16"),
        c("int3", "group", group_size=128, bias=True, m=256),
        c("int3", "group", group_size=128, m=1),  # shared-shift extraction (ThreeBitSharedShiftExtract)
        c("uint3", "group", group_size=64, zero_point="int", dtype="float16", m=16),
        c("int5", "group", group_size=32, tuning=T_WARPS_M2),
        c("int6", "group", group_size=128, dtype="float16", n=640, k=7168),
        c("int7", "channel", m=32),
        c("int8", "channel", m=1),
        c("int8", "group", group_size=128, dtype="float16", m=1024),
        # unsigned with integer / float zero points
        c("uint4", "group", group_size=128, zero_point="int", m=1),
        c("uint4", "group", group_size=128, zero_point="int", dtype="float16", m=4096),
        c("uint8", "group", group_size=64, zero_point="int", bias=True),
        c("uint4", "group", group_size=128, zero_point="float", m=16),
        c("uint2", "channel", zero_point="int", dtype="float16"),
        c("uint4", "group", group_size=64, zero_point="int", dtype="float16", tuning=T_WARPS_M2),
        # OCP MX fp4 and NVFP4
        c("float4e2m1", "group", group_size=32, scale_dtype="float8e8m0", m=1),
        c("float4e2m1", "group", group_size=32, scale_dtype="float8e8m0", dtype="float16", m=128),
        c("float4e2m1", "group", group_size=16, scale_dtype="float8e4m3", global_scale=True, m=1),
        c("float4e2m1", "group", group_size=16, scale_dtype="float8e4m3", global_scale=True, dtype="float16",
          bias=True, m=64),
        # fp8: channel and 128x128 block float32 scales, e5m2
        c("float8e4m3", "channel", scale_dtype="float32"),
        c("float8e4m3", "block", block=(128, 128), scale_dtype="float32", m=1),
        c("float8e4m3", "block", block=(128, 128), scale_dtype="float32", dtype="float16", m=1024),
        c("float8e5m2", "channel", scale_dtype="float32", dtype="float16"),
        c("float8e5m2", "group", group_size=128, m=8),
        # other small floats, e0 formats, a custom registered float
        c("float6e2m3", "group", group_size=32),
        c("float6e3m2", "tensor", scale_dtype="float32", dtype="float16"),
        c("float4e0m3", "group", group_size=64, dtype="float16"),
        c("float8e0m7", "channel"),
        c(CUSTOM_FLOAT_NAME, "group", group_size=128, bias=True),
        # granularities: tensor, group 48 (kernel groups of 16), group 256 (a group spans several k tiles)
        c("int4", "tensor", scale_dtype="float32"),
        c("int4", "group", group_size=48, m=16),
        c("int4", "group", group_size=256, dtype="float16", m=1),
        # explicit tunings: split-K + warps_k, warps_m, narrow n block, odd m8 tiles, four m warps, wide n block
        c("int4", "group", group_size=128, tuning=T_SPLITK, tag="splitk3-wk2"),
        c("int4", "group", group_size=128, dtype="float16", bias=True, tuning=T_ODD_M, tag="bm24"),
        c("float4e2m1", "group", group_size=32, scale_dtype="float8e8m0", tuning=T_WARPS_M4, tag="wm4"),
        c("uint4", "group", group_size=128, zero_point="int", tuning=T_NARROW, tag="bn64-splitk2"),
        c("float8e4m3", "channel", scale_dtype="float32", tuning=T_WIDE, tag="bn256"),
        c("int2", "group", group_size=64, tuning=T_WARP_K128, tag="wk128-splitk4"),
        c("int4", "group", group_size=128, out_dtype="float32", m=1),
        # group sizes (and block K sides) that are not multiples of 16: each register finds its group row
        c("int4", "group", group_size=8, m=1),
        c("int4", "group", group_size=24, m=4096),
        c("uint4", "group", group_size=40, zero_point="int", m=16),
        c("uint4", "group", group_size=100, zero_point="float", n=4000, k=1000, m=64),
        c("float4e2m1", "group", group_size=24, scale_dtype="float8e8m0", tuning=T_ODD_M, tag="bm24"),
        c("int4", "group", group_size=7, n=1001, k=1000, m=1),
        c("uint4", "group", group_size=7, zero_point="float", dtype="float16", tuning=T_SPLITK, tag="splitk3-wk2"),
        c("float8e4m3", "block", block=(128, 24), scale_dtype="float32", m=1),
    ]
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), f"duplicate case ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    return cases


CASES = codegen_cases()
CASE_IDS = [c.id for c in CASES]


def case_by_id(case_id: str) -> Case:
    for case in CASES:
        if case.id == case_id:
            return case
    raise KeyError(case_id)


# --- reading generated sources ---------------------------------------------------------------------

_LINE_COMMENT = re.compile(r"//[^\n]*")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def code_only(source: str) -> str:
    """The source without comments (so the header's configs and prose in comments are not code)."""
    return _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", source))


def code_without_strings(source: str) -> str:
    """code_only() and with string literals (inline PTX) blanked, leaving C++ identifiers."""
    return _STRING.sub('""', code_only(source))


_DEVICE_FN = re.compile(r"__device__\b[^;{(]*?\b([A-Za-z_]\w*)\s*\(")


def device_functions(source: str) -> list[str]:
    """Names of the __device__ functions defined in a source (the word before the first '(' after
    `__device__`; `__global__` entries are not matched)."""
    return _DEVICE_FN.findall(code_only(source))


def uncalled_device_functions(source: str) -> list[str]:
    """__device__ functions that nothing else in the source calls (a name followed by '(' or '<')."""
    code = code_only(source)
    unused = []
    for name in device_functions(source):
        uses = re.findall(rf"\b{re.escape(name)}\s*[(<]", code)
        if len(uses) < 2:  # the definition itself is one
            unused.append(name)
    return unused


def header_lines(source: str) -> list[str]:
    """The leading comment block of a generated file."""
    lines = []
    for line in source.splitlines():
        if not line.startswith("//"):
            break
        lines.append(line)
    return lines
