"""Element formats: full code tables, RNE + saturation encode, ml_dtypes parity, names, registry, properties."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from humming_gen.formats import DType, FloatType, IntType, dtype, register_dtype
from helpers import ML_DTYPES_NAMES, SMALL_FORMATS, brute_force_encode, code_table, random_values, sign_bit


def _all_codes(d: DType) -> torch.Tensor:
    return torch.arange(1 << d.bits, dtype=torch.int64)


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as values, NaN == NaN, and the sign of zero must agree (-0 and +0 are different codes)."""
    both_nan = np.isnan(a) & np.isnan(b)
    same = (a == b) & (np.signbit(a) == np.signbit(b))
    return bool(np.all(both_nan | same))


# --- full code tables ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_decode_every_code_matches_definition(name: str) -> None:
    d = dtype(name)
    got = d.decode(_all_codes(d)).numpy().astype(np.float64)
    assert d.decode(_all_codes(d)).dtype == torch.float32
    assert _same_values(got, code_table(name)), name


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_encode_decode_round_trip_every_code(name: str) -> None:
    d = dtype(name)
    codes = _all_codes(d)
    values = d.decode(codes)
    keep = ~torch.isnan(values)
    back = d.encode(values[keep])
    assert back.dtype == torch.int64
    assert torch.equal(back, codes[keep]), name


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_encode_random_values_is_nearest_ties_to_even(name: str) -> None:
    d = dtype(name)
    x = random_values(max(d.max_finite, 1.0), d.min_subnormal, 3000, seed=len(name))
    got = d.encode(torch.from_numpy(x)).numpy()
    assert np.array_equal(got, brute_force_encode(name, x)), name


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_exact_ties_round_to_even_code(name: str) -> None:
    d = dtype(name)
    table = code_table(name)
    vals = np.unique(table[np.isfinite(table)])
    mids = (vals[:-1] + vals[1:]) / 2  # exact in float64 for every format here
    if sign_bit(name) is not None:
        mids = mids[mids != 0]  # the +-0 pair has no midpoint
    got = d.encode(torch.from_numpy(mids)).numpy()
    assert np.array_equal(got, brute_force_encode(name, mids))
    assert np.all(got % 2 == 0), f"{name}: a tie went to an odd code"


def test_fp4_documented_midpoints() -> None:
    # docs/FORMATS.md 1.3: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4, >6 saturates.
    d = dtype("float4e2m1")
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -5.0, -0.25])
    assert d.decode(d.encode(x)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -4.0, -0.0]
    assert d.encode(torch.tensor([-0.25])).item() == 0x8  # rounds to -0


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_saturation_beyond_max(name: str) -> None:
    d = dtype(name)
    top = max(abs(d.max_finite), abs(d.min_finite), 1.0) * 1.5
    big = torch.tensor([top, 1e300, -top, -1e300, math.inf, -math.inf], dtype=torch.float64)
    out = d.decode(d.encode(big)).to(torch.float64)
    lo = d.min_finite
    expect = [d.max_finite, d.max_finite, lo, lo, d.max_finite, lo]
    if d.is_float and d.has_inf:  # IEEE-style e5m2 keeps infinities, saturates finite overflow
        expect[4], expect[5] = math.inf, -math.inf
    assert out.tolist() == expect, name


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_nan_encoding(name: str) -> None:
    d = dtype(name)
    code = d.encode(torch.tensor([math.nan])).item()
    if d.is_float and d.has_nan:
        assert code == d.nan_code
        assert math.isnan(d.decode(torch.tensor([code])).item())
    else:  # formats without NaN map it to the +0 code (or the smallest value) rather than failing
        assert not math.isnan(d.decode(torch.tensor([code])).item())


# --- ml_dtypes parity for the OCP formats ---------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ML_DTYPES_NAMES))
def test_decode_matches_ml_dtypes(name: str) -> None:
    d = dtype(name)
    mt = getattr(ml_dtypes, ML_DTYPES_NAMES[name])
    ref = np.arange(1 << d.bits, dtype=np.uint8).view(mt).astype(np.float64)
    got = d.decode(_all_codes(d)).numpy().astype(np.float64)
    # NaN sign bits are irrelevant; everything else, including -0, must match.
    assert _same_values(got, ref)
    finfo = ml_dtypes.finfo(mt)
    assert d.max_finite == float(finfo.max)
    assert d.min_subnormal == float(finfo.smallest_subnormal)


@pytest.mark.parametrize("name", sorted(set(ML_DTYPES_NAMES) - {"float8e8m0"}))
def test_encode_matches_ml_dtypes(name: str) -> None:
    # e8m0 is left out: ml_dtypes rounds its significand half-up (3 -> 4), humming_gen rounds to the nearest
    # value with ties to even (3 -> 2); neither is an MX scale rule, which the quantizers compute explicitly.
    d = dtype(name)
    mt = getattr(ml_dtypes, ML_DTYPES_NAMES[name])
    x = np.clip(random_values(d.max_finite, d.min_subnormal, 20000, seed=1), -d.max_finite, d.max_finite)
    table = code_table(name)
    vals = np.unique(table[np.isfinite(table)])
    x = np.concatenate([x, (vals[:-1] + vals[1:]) / 2, [0.0, -0.0]])
    ref = x.astype(np.float32).astype(mt).view(np.uint8).astype(np.int64) & ((1 << d.bits) - 1)
    got = d.encode(torch.from_numpy(x.astype(np.float32))).numpy()
    assert np.array_equal(got, ref), name


def test_e3m4_is_not_ml_dtypes_e3m4() -> None:
    # The contract: float8e3m4 is a generic custom float (every code finite, max 31). Blackwell's hidden
    # E3M4 reserves the all-ones code (docs/FORMATS.md 1.7, max 30); ml_dtypes float8_e3m4 is IEEE-style (max 15.5).
    assert dtype("float8e3m4").max_finite == 31.0
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e3m4).max) == 15.5


# --- properties -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, max_finite, min_sub", [
    ("float4e2m1", 6.0, 0.5), ("float6e2m3", 7.5, 0.125), ("float6e3m2", 28.0, 0.0625),
    ("float8e4m3", 448.0, 2.0 ** -9), ("float8e5m2", 57344.0, 2.0 ** -16), ("float8e8m0", 2.0 ** 127, 2.0 ** -127),
    ("float8e3m4", 31.0, 2.0 ** -6), ("float8e0m7", 127.0, 1.0), ("float4e0m3", 7.0, 1.0),
    ("float5e2m2", 7.0, 0.25), ("float3e1m1", 3.0, 1.0), ("int4", 7.0, 1.0), ("uint4", 15.0, 1.0),
    ("int1", 0.0, 1.0), ("float16", 65504.0, 2.0 ** -24), ("bfloat16", 3.3895313892515355e38, 2.0 ** -133),
])
def test_max_finite_and_min_subnormal(name: str, max_finite: float, min_sub: float) -> None:
    d = dtype(name)
    assert d.max_finite == max_finite
    assert d.min_subnormal == min_sub


def test_min_finite() -> None:
    assert dtype("int4").min_finite == -8.0
    assert dtype("int1").min_finite == -1.0
    assert dtype("uint3").min_finite == 0.0
    assert dtype("float8e4m3").min_finite == -448.0
    assert dtype("float8e8m0").min_finite == 2.0 ** -127


def test_bits_and_flags() -> None:
    assert [dtype(n).bits for n in ("int3", "uint8", "float6e3m2", "float8e8m0", "bfloat16")] == [3, 8, 6, 8, 16]
    assert dtype("float8e4m3").nan_code == 0xFF and not dtype("float8e4m3").has_inf
    assert dtype("float8e5m2").inf_code == 0x7C
    assert not dtype("float8e8m0").signed and dtype("float8e8m0").nan_code == 0xFF
    assert dtype("float4e0m3").is_sign_magnitude_int
    assert dtype("float8e4m3").emax == 8 and dtype("float4e2m1").emax == 2 and dtype("float8e5m2").emax == 15


def test_e8m0_code_255_decodes_to_nan() -> None:
    """OCP MX: e8m0 0xFF is NaN, not 2^128 (+inf in fp32), in DType.decode, the code table and the reference layout
    of kernel-layout activation scales (uint8 codes)."""
    from humming_gen.schemes.quantize import QuantizedActivation
    from humming_gen.schemes.scheme import ActivationScheme

    e8m0 = dtype("float8e8m0")
    for codes in (torch.tensor([0, 127, 254, 255]), torch.tensor([0, 127, 254, 255], dtype=torch.uint8)):
        values = e8m0.decode(codes)
        assert values[:3].tolist() == [2.0 ** -127, 1.0, 2.0 ** 127] and math.isnan(values[3])
    assert math.isnan(e8m0.code_values()[255]) and e8m0.max_finite == 2.0 ** 127
    scheme = ActivationScheme("float8e4m3", granularity="group", group_size=32, scale_dtype="float8e8m0")
    qa = QuantizedActivation(scheme, torch.zeros(1, 64, dtype=torch.uint8),
                             torch.tensor([[127, 255]], dtype=torch.uint8), layout="kernel")
    scales = qa.to_reference().scales
    assert scales[0, 0] == 1.0 and math.isnan(scales[0, 1])


REPRESENTS = [  # (container, content, exactly representable?) computed from the value sets
    ("float8e4m3", "int4", True), ("float8e4m3", "int5", True), ("float8e4m3", "uint4", True),
    ("float8e4m3", "int6", False), ("float8e4m3", "int8", False), ("float8e4m3", "float4e2m1", True),
    ("float8e4m3", "float4e0m3", True), ("float8e4m3", "float6e2m3", True), ("float8e4m3", "float6e3m2", True),
    ("float8e4m3", "float8e5m2", False), ("float8e4m3", "float8e0m7", False),
    ("int8", "int4", True), ("int8", "uint4", True), ("int8", "float4e0m3", True), ("int8", "float8e0m7", True),
    ("int8", "uint8", False), ("int8", "float4e2m1", False), ("int4", "float4e0m3", True),
    ("float4e2m1", "int2", True), ("float4e2m1", "int3", True), ("float4e2m1", "int4", False),
    ("float4e2m1", "float4e0m3", False), ("float4e2m1", "uint2", True),
    ("bfloat16", "float8e4m3", True), ("bfloat16", "float8e5m2", True), ("bfloat16", "float8e8m0", True),
    ("bfloat16", "int8", True), ("bfloat16", "uint8", True), ("bfloat16", "int16", False),
    ("float16", "float8e4m3", True), ("float16", "float8e5m2", True), ("float16", "float8e8m0", False),
    ("float16", "int8", True), ("float32", "bfloat16", True), ("float32", "float16", True),
    ("float8e5m2", "float4e2m1", True), ("float8e5m2", "float8e4m3", False),
]


@pytest.mark.parametrize("container, content, expected", REPRESENTS)
def test_represents(container: str, content: str, expected: bool) -> None:
    assert dtype(container).represents(dtype(content)) is expected


def test_e4m3_carries_every_integer_up_to_16() -> None:
    d = dtype("float8e4m3")
    ints = torch.arange(-16, 17, dtype=torch.float64)
    assert torch.equal(d.decode(d.encode(ints)).to(torch.float64), ints)
    assert d.decode(d.encode(torch.tensor([17.0]))).item() != 17.0


# --- names and registry -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, fragment", [
    ("float8e4m4", "inconsistent"), ("float7e4m3", "inconsistent"), ("int0", "1..32"), ("int33", "1..32"),
    ("uint0", "1..32"), ("foo", "unknown dtype"), ("float", None), ("float9e4m4", "8 bits"),
    ("float10e9m0", "float10e9m0"), ("float1e0m0", "at least one"), ("int4x", "unknown dtype"),
])
def test_name_errors(name: str, fragment: str | None) -> None:
    if fragment is None:  # "float" is an alias of float32, not an error
        assert dtype(name) == dtype("float32")
        return
    with pytest.raises(ValueError, match=fragment):
        dtype(name)


def test_wide_ints_parse() -> None:
    assert dtype("int9").bits == 9 and dtype("int32").max_value == 2 ** 31 - 1 and dtype("uint16").signed is False


def test_dtype_type_error() -> None:
    with pytest.raises(TypeError):
        dtype(4)  # type: ignore[arg-type]


def test_aliases() -> None:
    assert dtype("fp8") == dtype("float8e4m3")
    assert dtype("float8_e8m0fnu") == dtype("float8e8m0")
    assert dtype("bf16") == dtype("bfloat16")
    assert dtype(dtype("int4")) is dtype("int4") or dtype(dtype("int4")) == dtype("int4")


def test_register_custom_float_and_int() -> None:
    fl = register_dtype("test_fp5", FloatType(exponent_bits=3, mantissa_bits=1))
    it = register_dtype("test_u5", IntType(bits=5, signed=False))
    assert dtype("test_fp5") == fl and fl.name == "test_fp5" and fl.bits == 5
    assert dtype("test_u5") == it and it.max_value == 31 and it.name == "test_u5"
    # Same semantics as the generic float5e3m1: bias 3, subnormals, every code finite.
    generic = dtype("float5e3m1")
    assert fl.max_finite == generic.max_finite == 24.0
    codes = torch.arange(32)
    assert torch.equal(fl.decode(codes), generic.decode(codes))
    x = torch.linspace(-13, 13, 501)
    assert torch.equal(fl.encode(x), generic.encode(x))
    assert dtype("float8e4m3").represents(fl)


def test_register_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="identifier"):
        register_dtype("9bad name", FloatType(2, 1))
    with pytest.raises(TypeError, match="DType"):
        register_dtype("ok_name", "float4e2m1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="built-in"):
        register_dtype("float8e4m3", FloatType(4, 3))  # generic e4m3 has no NaN: different semantics


def test_type_constructor_errors() -> None:
    with pytest.raises(ValueError, match="bits"):
        IntType(0)
    with pytest.raises(ValueError, match="exponent_bits"):
        FloatType(9, 1)
    with pytest.raises(ValueError, match="nan"):
        FloatType(2, 1, nan="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="e0"):
        FloatType(0, 3, signed=False)


def test_16_bit_encode_is_single_rounding_from_float64() -> None:
    # torch's float64 -> bf16/fp16 casts round twice (via float32); encode must round once.
    x = torch.tensor([1 + 2 ** -8 + 2 ** -30], dtype=torch.float64)
    assert dtype("bfloat16").decode(dtype("bfloat16").encode(x)).item() == 1 + 2 ** -7
    y = torch.tensor([1 + 2 ** -11 + 2 ** -30], dtype=torch.float64)
    assert dtype("float16").decode(dtype("float16").encode(y)).item() == 1 + 2 ** -10
    # numpy converts float64 -> float16 in one rounding: an independent oracle for random float64 inputs.
    r = np.random.default_rng(0).standard_normal(20000) * np.exp2(np.random.default_rng(1).uniform(-26, 17, 20000))
    with np.errstate(over="ignore"):
        ref = r.astype(np.float16).view(np.uint16).astype(np.int64)
    ref = np.where(np.abs(r) > 65504, np.where(r > 0, 0x7BFF, 0xFBFF), ref)  # saturate instead of inf
    assert np.array_equal(dtype("float16").encode(torch.from_numpy(r)).numpy(), ref)
    z = torch.randn(1000, dtype=torch.float64)
    for name, td in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        z32 = z.to(torch.float32)  # from float32 a torch cast is a single rounding: must agree
        assert torch.equal(dtype(name).decode(dtype(name).encode(z32)), z32.to(td).to(torch.float32))


def test_int_encode_rne_and_clamp() -> None:
    d = dtype("int4")
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 7.4, 7.6, -8.4, -9.0, 100.0])
    assert d.decode(d.encode(x)).tolist() == [0, 2, 2, 0, -2, -2, 7, 7, -8, -8, 7]
    u = dtype("uint3")
    assert u.decode(u.encode(torch.tensor([-1.0, 3.5, 4.5, 9.0]))).tolist() == [0, 4, 4, 7]


@pytest.mark.parametrize("bad", ["a\nb", "e2m2\n// injected", "../e2m2", "dir/e2m2", "e2m2.cu", "9lives", "",
                                 "x" * 65, "e 2", "e2m2'"])
def test_format_names_are_checked_where_a_format_is_made(bad) -> None:
    """Names reach kernel names, the source header and cache / lock file names: newlines and path characters
    are refused by FloatType / IntType themselves, not only by register_dtype."""
    with pytest.raises(ValueError) as info:
        FloatType(2, 2, name=bad)
    assert "FloatType name" in str(info.value) and repr(bad) in str(info.value)
    with pytest.raises(ValueError, match="IntType name"):
        IntType(5, name=bad)


def test_generated_names_are_identifiers() -> None:
    assert FloatType(3, 2, bias=-2).name == "float6e3m2_biasm2"
    assert FloatType(4, 3, nan="all_ones", subnormals=False).name == "float8e4m3_nanallones_nosub"


def test_reregistering_a_name_with_another_format_is_refused() -> None:
    first = register_dtype("test_rereg", FloatType(2, 2))
    assert register_dtype("test_rereg", FloatType(2, 2)) == first  # the same format again: a no-op
    with pytest.raises(ValueError, match="'test_rereg' is already registered"):
        register_dtype("test_rereg", FloatType(3, 1))
    assert dtype("test_rereg") == first


@pytest.mark.parametrize("fmt", [FloatType(2, 2, name="test_e2m2"), IntType(5, signed=False, name="test_u5b"),
                                 FloatType(3, 2, bias=-2, nan="all_ones", subnormals=False),
                                 FloatType(0, 4, name="test_sm5")])
def test_format_description_round_trip(fmt) -> None:
    from humming_gen.formats import dtype_from_dict, format_spec

    assert dtype_from_dict(fmt.to_dict()) == fmt
    assert dtype(fmt.to_dict()) == fmt
    assert format_spec(fmt) == fmt.to_dict()  # not a built-in name: written out in full
    assert format_spec(dtype("float4e2m1")) == "float4e2m1" and format_spec(dtype("uint4")) == "uint4"


def test_format_description_errors() -> None:
    from humming_gen.formats import dtype_from_dict

    with pytest.raises(ValueError, match="'kind' must be 'int' or 'float'"):
        dtype_from_dict({"bits": 4})
    with pytest.raises(ValueError, match=r"unknown keys \['exponent'\]"):
        dtype_from_dict({"kind": "float", "exponent": 2, "mantissa_bits": 2})
    with pytest.raises(ValueError, match="FloatType name"):
        dtype_from_dict({"kind": "float", "exponent_bits": 2, "mantissa_bits": 2, "name": "x\ny"})
