"""Code generation for the matrix of tests/cpu/codegen_cases.py: deterministic rendering, a complete header,
no trace of unselected components, NVRTC compilation for every CUDA target without spills, NVCC for a sample,
and ComposeError messages that name what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codegen_cases import (CASE_IDS, CASES, COMPILE_ARCHS, Case, case_by_id, code_only, code_without_strings,
                           device_functions, header_lines, uncalled_device_functions)
from humming_gen.codegen.compose import SECTION_ORDER, ComposeError, compose
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.kernel import build, build_many, generate
from humming_gen.runtime.compile import CompilerUnavailableError
from humming_gen.targets import get_target

HERE = Path(__file__).resolve().parent
INT4_G128 = "w4a16-int4-g128-bf16-m1"
COMPILER = "nvrtc"  # sources name their compiler in the header; pin it so HUMMING_GEN_COMPILER cannot vary it


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    """Compile for real into a throw-away disk cache (not the user's ~/.cache/humming_gen)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path_factory.mktemp("hg-cache")))
        mp.delenv("HUMMING_GEN_NO_CACHE", raising=False)
        yield


_SOURCES: dict[tuple[str, str], str] = {}


def source_of(case_id: str, target: str = "sm_90a") -> str:
    key = (case_id, target)
    if key not in _SOURCES:
        _SOURCES[key] = generate(case_by_id(case_id).plan(target), COMPILER)
    return _SOURCES[key]


def body_of(source: str) -> str:
    """Everything after the header comment block."""
    return source[len("\n".join(header_lines(source))):]


def test_matrix_size_and_spread() -> None:
    assert len(CASES) >= 30
    weights = {c.layer.scheme.weight.name for c in CASES}
    assert {f"int{b}" for b in range(1, 9)} <= weights
    assert {"uint4", "uint8", "float4e2m1", "float8e4m3", "float8e5m2", "float6e2m3", "float4e0m3",
            "float8e0m7"} <= weights
    grans = {(c.layer.scheme.granularity, c.layer.scheme.group_size) for c in CASES}
    for g in (32, 64, 128, 48, 8, 24, 40, 100, 7):
        assert ("group", g) in grans
    assert {"channel", "block", "tensor"} <= {g for g, _ in grans}
    assert {c.layer.dtype for c in CASES} == {"bfloat16", "float16"}
    assert {c.layer.has_bias for c in CASES} == {True, False}
    explicit = [c.tuning for c in CASES if c.tuning is not None]
    assert any(t.split_k > 1 for t in explicit) and any(t.warps_k > 1 for t in explicit)
    assert any(t.warps_m > 1 for t in explicit)
    assert len({source_of(case.id) for case in CASES}) == len(CASES), "two cases render the same source"
    for case in CASES:
        assert re.fullmatch(r"[A-Za-z_]\w*", case.plan("sm_90a").kernel_name)


# --- determinism ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_rendering_is_deterministic(case_id: str) -> None:
    case = case_by_id(case_id)
    first = generate(case.plan("sm_90a"), COMPILER)
    again = generate(case.plan(get_target("sm_90a")), COMPILER)  # a fresh plan from fresh configs
    assert first == again


_SUBPROCESS_SCRIPT = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from codegen_cases import CASES
from humming_gen.kernel import generate
print(json.dumps({c.id: hashlib.sha256(generate(c.plan("sm_90a"), "nvrtc").encode()).hexdigest() for c in CASES}))
"""


def test_rendering_is_identical_across_processes() -> None:
    """Another interpreter with another hash seed renders byte-identical sources (no set/dict-order leaks)."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS_SCRIPT, str(HERE)], capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout
    theirs = json.loads(out.strip().splitlines()[-1])
    ours = {c.id: hashlib.sha256(source_of(c.id).encode()).hexdigest() for c in CASES}
    assert theirs == ours


# --- header and structure ---------------------------------------------------------------------------------
def _header_json(lines: list[str], what: str) -> dict:
    found = [line for line in lines if re.match(rf"//\s+{what}\s+\{{", line)]
    assert len(found) == 1, f"header has {len(found)} '{what}' JSON lines"
    return json.loads(found[0].split(what, 1)[1])


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_header_is_complete(case_id: str) -> None:
    case = case_by_id(case_id)
    plan = case.plan("sm_90a")
    src = source_of(case_id)
    header = header_lines(src)
    text = "\n".join(header)
    assert header[0].startswith("// humming_gen ")
    assert re.search(rf"^// kernel\s+{plan.kernel_name}\s+key [0-9a-f]{{12}}$", text, re.M)
    # the toolchain that compiles it: compiler name and version, and the full option list
    assert re.search(r"^// target\s+sm_90a\s+compiler nvrtc [\d.]+\s+options .*-arch=sm_90a\b", text, re.M)
    assert _header_json(header, "layer") == json.loads(json.dumps(plan.layer.to_dict()))
    assert _header_json(header, "compute") == json.loads(json.dumps(plan.compute.to_dict()))
    assert _header_json(header, "tuning") == json.loads(json.dumps(plan.tuning.to_dict()))
    # every component, in order, in the header; each one's section opens with the same line
    start, end = header.index("// components (in order):"), header.index("// full configs (JSON):")
    listed = [line.removeprefix("//   ") for line in header[start + 1:end]]
    assert listed == [c.describe() for c in plan.components]
    body = body_of(src)
    for c in plan.components:
        assert f"// ---- {c.describe()}\n" in body
    # sections in the fixed order
    families = re.findall(r"^// =+ (\w+)$", body, re.M)
    assert families == [f for f in SECTION_ORDER if any(c.family == f for c in plan.components)]
    # extern "C" entry named like the kernel, and nothing the source would need from outside
    assert re.search(rf'extern "C" __global__ void __launch_bounds__\([^)]*\) {plan.kernel_name}\(', body)
    assert len(re.findall(r'extern "C"', body)) == 1
    assert "#include" not in src and "#define" not in src


@pytest.mark.parametrize("case_id", CASE_IDS[::4])
def test_header_configs_rebuild_the_kernel(case_id: str) -> None:
    """The header alone is enough to rebuild the kernel: its JSON configs compose to the same source."""
    src = source_of(case_id)
    header = header_lines(src)
    layer = LayerConfig.from_dict(_header_json(header, "layer"))
    compute = ComputeConfig.from_dict(_header_json(header, "compute"))
    tuning = TuningConfig.from_dict(_header_json(header, "tuning"))
    assert generate(compose(layer, compute, tuning, get_target("sm_90a")), COMPILER) == src


# --- dead branches ----------------------------------------------------------------------------------------
ASYNC_PIPELINE_WORDS = ("tma", "TMA", "wgmma", "mbarrier", "tcgen05", "setmaxnreg", "cp.async.bulk")
PREPROCESSOR_BRANCH = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b|\bif\s+constexpr\b", re.M)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_int4_g128_source_has_no_unselected_text(target: str) -> None:
    src = source_of(INT4_G128, target)
    body = body_of(src)  # the header's JSON names every config field (zero_point: null), so skip it
    for word in ("fp8", "e4m3", "e5m2", "b_zero", "zero_point") + ASYNC_PIPELINE_WORDS:
        assert word not in body, f"{word!r} in the int4 g128 {target} source"
    assert not PREPROCESSOR_BRANCH.search(src)
    if get_target(target).has("pdl"):
        assert "griddepcontrol" in body
    else:
        assert "griddepcontrol" not in src


def test_int4_g128_source_has_no_zero_point_identifiers() -> None:
    for target in ("sm_80", "sm_90a"):
        code = code_without_strings(source_of(INT4_G128, target))
        found = sorted(set(re.findall(r"\b\w*zero\w*\b", code, re.I)))
        assert not found, f"zero-point identifiers in the int4 g128 {target} source: {found}"


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_no_trace_of_unselected_components(case_id: str) -> None:
    case = case_by_id(case_id)
    s = case.layer.scheme
    src = source_of(case_id)
    body = body_of(src)
    assert not PREPROCESSOR_BRANCH.search(src)
    plan = case.plan("sm_90a")
    # each pipeline's source holds none of the other's machinery
    other = ASYNC_PIPELINE_WORDS if plan.pipeline == "standard" else ("ldmatrix", "mma.sync", "tcgen05", "cp_async_wait")
    for word in other:
        assert word not in code_only(body), f"{word!r} in a {plan.pipeline} source"
    if s.weight.name not in ("float8e4m3", "float8e5m2") and s.scale_dtype.name not in ("float8e4m3", "float8e5m2"):
        for word in ("fp8", "e4m3", "e5m2"):
            assert word not in body, word
    if s.zero_point is None:
        assert "b_zero" not in body
    else:
        assert "b_zero" in code_only(body)
    if s.granularity in ("channel", "tensor") and s.zero_point is None:
        assert "b_scale" not in body  # applied in the epilogue as out_scale
    else:
        assert "b_scale" in code_only(body)
    assert ("workspace" in code_only(body)) == (plan.tuning.split_k > 1)
    assert ("bias" in code_without_strings(body)) == case.layer.has_bias


KNOWN_UNCALLED: set[str] = set()  # every emitted wrapper must be called


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_no_uncalled_device_functions_beyond_known(case_id: str, target: str) -> None:
    src = source_of(case_id, target)
    assert len(device_functions(src)) >= 8
    extra = set(uncalled_device_functions(src)) - KNOWN_UNCALLED
    assert not extra, f"__device__ functions defined but never called: {sorted(extra)}"


def test_no_uncalled_ptx_wrappers() -> None:
    offenders = {}
    for case in CASES:
        for target in ("sm_80", "sm_90a"):
            unused = uncalled_device_functions(source_of(case.id, target))
            if unused:
                offenders[f"{case.id}@{target}"] = unused
    assert not offenders, offenders


def test_uncalled_function_detector() -> None:
    """The regex helpers find definitions (templates included) and see through comments."""
    src = ("template <int N>\n__device__ __forceinline__ void waiter() {}\n"
           "__device__ __forceinline__ u32 used(u32 a) { return a; }\n"
           "__device__ __forceinline__ u32 dead(u32 a) { return a; }  // dead(1) in a comment is no call\n"
           "extern \"C\" __global__ void k() { waiter<1>(); used(2); }\n")
    assert device_functions(src) == ["waiter", "used", "dead"]
    assert uncalled_device_functions(src) == ["dead"]


# --- compilation ------------------------------------------------------------------------------------------
_BUILT: dict[str, dict] = {}


def _built(arch: str) -> dict:
    """All cases for one arch, compiled in parallel once (build_many); per-case results or the error."""
    if arch not in _BUILT:
        plans = [case.plan(arch) for case in CASES]
        try:
            kernels = build_many(plans, compiler=COMPILER)
            _BUILT[arch] = dict(zip(CASE_IDS, kernels))
        except Exception:  # one bad kernel: fall back to one build per case so each test reports its own
            _BUILT[arch] = {}
    return _BUILT[arch]


@pytest.mark.parametrize("case_id", CASE_IDS)
@pytest.mark.parametrize("arch", COMPILE_ARCHS)
def test_compiles_with_nvrtc_without_spills(arch: str, case_id: str) -> None:
    kernel = _built(arch).get(case_id)
    if kernel is None:
        kernel = build(case_by_id(case_id).plan(arch), compiler=COMPILER)  # raises CompileError with the log
    assert kernel.compiled is not None and kernel.compiled.cubin
    assert kernel.compiled.arch == arch
    res = kernel.resources
    assert res.get("registers", 0) > 0
    if "spill_store_bytes" in res:  # absent when the compiler returned no ptxas report (checked per kernel)
        assert res["spill_store_bytes"] == 0, f"{kernel.name} spills {res['spill_store_bytes']} B on {arch}"
        assert res.get("spill_load_bytes", 0) == 0
    assert res.get("registers", 0) <= 255


@pytest.mark.parametrize("case_id", [INT4_G128, "w4a16-uint4-g128-zpint-fp16-m4096"])
def test_compiles_with_nvcc(case_id: str) -> None:
    """A sample through NVCC as well (a second front end catches non-portable source)."""
    plan = case_by_id(case_id).plan("sm_90a")
    try:
        kernel = build(plan, compiler="nvcc")
    except CompilerUnavailableError as e:
        pytest.skip(f"nvcc is not installed here: {e}")
    assert kernel.compiled.cubin and kernel.compiled.compiler.startswith("nvcc")
    res = kernel.resources
    assert res.get("registers", 0) > 0
    if "spill_store_bytes" in res:
        assert res["spill_store_bytes"] == 0


@pytest.mark.parametrize("case_id", [INT4_G128, "w8a16-int8-ch-bf16-m1", "w4a16-uint4-g128-zpint-fp16-m4096"])
def test_sm75_needs_cp_async(case_id: str) -> None:
    case = case_by_id(case_id)
    with pytest.raises(ComposeError) as info:
        case.plan("sm_75")
    msg = str(info.value)
    assert "'cp_async'" in msg and "sm_75" in msg
    if case.layer.dtype == "bfloat16":
        assert "bf16" in msg  # every reason is listed, not just the first


def test_zhenwu_is_refused_naming_the_missing_back_end() -> None:
    """zhenwu810e's ppu.-prefixed mma back end is not generated yet: compose says so instead of emitting mma.sync
    code its compiler would reject (and that compiler is not available here anyway)."""
    with pytest.raises(ComposeError) as info:
        case_by_id(INT4_G128).plan("zhenwu810e")
    msg = str(info.value)
    assert "zhenwu810e" in msg and "mma back end" in msg and "not generated yet" in msg


# --- ComposeError messages --------------------------------------------------------------------------------
_LAYER = LayerConfig(4096, 4096, "w4a16-int4-g128")
_TUNING = TuningConfig(block_m=16, block_n=128, block_k=128, warps_m=1, warps_n=2, warps_k=2, stages=4)


def _compose_error(layer=_LAYER, compute=None, tuning=_TUNING, target="sm_90a") -> str:
    with pytest.raises(ComposeError) as info:
        compose(layer, compute or ComputeConfig(), tuning, get_target(target))
    return str(info.value)


def test_error_unsupported_pipeline() -> None:
    tuning = TuningConfig(pipeline="umma", mma="tcgen05", block_m=64, block_n=128, block_k=64, warps_m=1, warps_n=1,
                          warps_k=1)
    msg = _compose_error(tuning=tuning)
    assert "tuning.pipeline='umma'" in msg and "standard" in msg and "warp_specialized" in msg


_WS_TUNING = TuningConfig(pipeline="warp_specialized", mma="wgmma", block_m=128, block_n=256, block_k=128, warps_m=1,
                          warps_n=8, warps_k=1, a_load="cp_async", b_load="tma", scale_load="tma", stages=4)


@pytest.mark.parametrize("target, missing", [("sm_89", "wgmma"), ("sm_80", "wgmma"), ("sm_100a", "wgmma"),
                                             ("sm_120a", "wgmma")])
def test_error_warp_specialized_on_other_targets_names_the_feature(target: str, missing: str) -> None:
    msg = _compose_error(tuning=_WS_TUNING, target=target)
    assert f"lacks '{missing}'" in msg and target in msg


def test_error_warp_specialized_tuning_reasons() -> None:
    bad = TuningConfig(**{**_WS_TUNING.to_dict(), "block_m": 192, "block_n": 512, "block_k": 256, "b_load": "cp_async"})
    msg = _compose_error(tuning=bad)
    for needle in ("tuning.block_n=512", "tuning.block_k=256", "b_load"):
        assert needle in msg, needle
    msg = _compose_error(tuning=TuningConfig(**{**_WS_TUNING.to_dict(), "block_m": 192}))
    assert "tuning.block_m=192" in msg and "176" in msg
    arbitrary = LayerConfig(4096, 4096, hg_scheme(weight="int4", group_size=100))
    assert "standard pipeline" in _compose_error(layer=arbitrary, tuning=_WS_TUNING)


def hg_scheme(**kwargs):
    from humming_gen.schemes import QuantScheme

    return QuantScheme(**kwargs)


@pytest.mark.parametrize("gemm", ["grouped_contiguous", "grouped_masked"])
def test_grouped_gemms_compose_on_both_pipelines(gemm: str) -> None:
    """Grouped MoE gemm types compose on the standard pipeline (tests/cpu/test_moe_gemm.py) and, on sm_90a, the
    warp-specialized one (tests/cpu/test_moe_grouped_ws.py), a layer of one expert included; the router weights
    stay the caller's for grouped layouts."""
    from humming_gen.heuristics import choose_tunings

    ws = choose_tunings(_LAYER, get_target("sm_90a")).for_m(1024)
    plan = compose(_LAYER, ComputeConfig(gemm=gemm), ws, get_target("sm_90a"))
    assert plan.pipeline == "warp_specialized" and plan.compute.gemm == gemm
    assert "router weights are applied by the caller" in _compose_error(
        compute=ComputeConfig(gemm=gemm, topk_weight=True), tuning=ws)


def test_error_grouped_gemm_refuses_split_k() -> None:
    """'indexed' (MoE) composes on the standard pipeline with or without split-K (tests/cpu/test_moe_gemm.py,
    test_moe_split_k.py); a split-K tuning is refused for the grouped gemm types, naming split_k."""
    split = TuningConfig(block_m=16, block_n=128, block_k=128, warps_m=1, warps_n=2, warps_k=2, stages=4, split_k=2)
    assert "grouped_masked MoE kernels take split_k=1" in _compose_error(compute=ComputeConfig(gemm="grouped_masked"),
                                                                        tuning=split)


def test_error_unsupported_compute_options() -> None:
    assert "compute.accumulate='float16'" in _compose_error(compute=ComputeConfig(accumulate="float16"))
    assert "epilogue" in _compose_error(compute=ComputeConfig(epilogue_activation="silu_mul"))
    msg = _compose_error(tuning=TuningConfig(mma="m16n8k32", block_m=16, block_n=128, block_k=128, warps_n=2,
                                             warps_k=2))
    assert "tuning.mma='m16n8k32'" in msg


@pytest.mark.parametrize("preset", ["w4a4-nvfp4"])
def test_error_quantized_activation_scheme(preset: str) -> None:
    layer = LayerConfig(4096, 4096, preset)
    msg = _compose_error(layer=layer)
    assert "activation" in msg and layer.scheme.activation.dtype.name in msg


def test_error_shared_memory_overflow() -> None:
    tuning = TuningConfig(block_m=128, block_n=256, block_k=128, warps_m=2, warps_n=4, warps_k=1, stages=8)
    msg = _compose_error(tuning=tuning, target="sm_86")
    assert "shared memory" in msg and "stages=8" in msg and "sm_86" in msg
    assert str(get_target("sm_86").smem_per_block_optin) in msg
    compose(_LAYER, ComputeConfig(), tuning.__class__(**{**tuning.to_dict(), "stages": 2}), get_target("sm_90a"))


def test_error_split_k_and_layout() -> None:
    msg = _compose_error(tuning=TuningConfig(block_m=16, block_n=128, block_k=128, warps_n=2, warps_k=2, split_k=64))
    assert "tuning.split_k=64" in msg and "32 k tiles" in msg
    msg = _compose_error(tuning=TuningConfig(block_m=16, block_n=128, block_k=96, warps_n=2, warps_k=1))
    assert "block_k=96" in msg and "mma tiles" in msg  # two reasons, both listed
    msg = _compose_error(tuning=TuningConfig(block_m=16, block_n=128, block_k=128, warps_n=8, warps_k=1))
    assert "16x128" in msg and "multiple of 16" in msg


def test_error_lists_every_reason_once() -> None:
    tuning = TuningConfig(pipeline="warp_specialized", block_m=64, block_n=128, block_k=64, warps_n=1, split_k=100)
    msg = _compose_error(layer=LayerConfig(4096, 4096, "w4a8-int4-g128-fp8"),
                         compute=ComputeConfig(epilogue_activation="silu_mul"), tuning=tuning)
    lines = msg.splitlines()[1:]
    assert len(lines) == len(set(lines)) >= 4
    for needle in ("tuning.mma", "compute.epilogue_activation", "tuning.block_k", "tuning.split_k"):
        assert sum(needle in line for line in lines) == 1, needle


def test_case_ids_read_like_the_config() -> None:
    case: Case = case_by_id(INT4_G128)
    assert case.layer.scheme.weight.name == "int4" and case.layer.scheme.group_size == 128
    assert case.layer.dtype == "bfloat16" and case.m == 1
