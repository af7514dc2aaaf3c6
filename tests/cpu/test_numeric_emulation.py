"""Register-level dequantization tricks against DType.decode, through their Python emulations.

For every weight format of <= 8 bits and both 16-bit compute types, the converter compose() selects turns every
code (after the kernel-code transform: signed ints are stored offset-binary) into exactly the decoded value,
once the scale step has subtracted the converter's bias and the format offset. The emulations model the bit
operations on a 16-bit lane from the constants the templates render; the GPU tests run the real kernels.
Non-finite codes (e4m3 NaN, e5m2 inf/NaN) are skipped: quantizers never emit them as weights.
"""

from __future__ import annotations

import math

import pytest
import torch

from codegen_cases import CUSTOM_FLOAT
from helpers import FLOAT_FORMATS, INT_FORMATS
from humming_gen.codegen.compose import ComposeError, compose
from humming_gen.components.numeric.convert import (FloatPlaceConvert, IntMagicConvert, IntTopBitConvert,
                                                    SignMagnitudeConvert, check_exact, kernel_codes_offset,
                                                    select_converter)
from humming_gen.components.numeric.halfbits import MANTISSA_BITS, TORCH_DTYPE
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.formats import DType, FloatType, dtype
from humming_gen.schemes import QuantScheme
from humming_gen.targets import get_target

DTYPES = ("bfloat16", "float16")

# Formats beyond the built-in names: an unsigned float, a non-standard bias, a registered custom one.
CUSTOM_FORMATS: dict[str, DType] = {
    "custom-e2m2": CUSTOM_FLOAT,
    "float4e3m1u": FloatType(3, 1, signed=False),
    "e4m3-bias9": FloatType(4, 3, nan="all_ones", bias=9),
    "e3m2-no-subnormals": FloatType(3, 2, subnormals=False),
}
FORMATS: dict[str, DType] = {**{n: dtype(n) for n in INT_FORMATS + list(FLOAT_FORMATS)}, **CUSTOM_FORMATS}

KNOWN_BUGS: dict = {}  # (format, dtype) -> pytest mark, for generator bugs kept visible


def _servable(fmt: DType, dt: str) -> bool:
    """What the converters promise: exact when the values fit, except formats without subnormals (whose
    exponent-0 codes are normal numbers: e8m0), which are refused rather than converted wrongly."""
    no_subnormals = isinstance(fmt, FloatType) and not fmt.subnormals and fmt.exponent_bits > 0
    return _exactly_representable(fmt, dt) and not no_subnormals


def _exactly_representable(fmt: DType, dt: str) -> bool:
    """Independent check: every finite value of `fmt` survives a round trip through the torch dtype."""
    values = fmt.code_values()
    values = values[torch.isfinite(values)]
    return bool(torch.equal(values.to(TORCH_DTYPE[dt]).to(torch.float64), values))


def _pairs(with_converter: bool, known_bugs: bool = False):
    out = []
    for name, fmt in FORMATS.items():
        for dt in DTYPES:
            try:
                select_converter(fmt, dt)
                has = True
            except ValueError:
                has = False
            if has == with_converter:
                marks = KNOWN_BUGS.get((name, dt), ()) if known_bugs else ()
                out.append(pytest.param(name, dt, id=f"{name}-{dt}", marks=marks))
    return out


def _round(value: float, dt: str) -> float:
    return torch.tensor([value], dtype=torch.float64).to(TORCH_DTYPE[dt]).item()


def _same(a: float, b: float) -> bool:
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.mark.parametrize("name, dt", _pairs(with_converter=True, known_bugs=True))
def test_converter_reproduces_decode_for_every_code(name: str, dt: str) -> None:
    fmt = FORMATS[name]
    conv = select_converter(fmt, dt)
    offset = kernel_codes_offset(fmt)
    subtract = conv.bias + offset
    check_exact(subtract, dt)  # the scale step's constant must itself be exact in the compute type
    values = fmt.decode(torch.arange(1 << fmt.bits)).tolist()
    wrong = []
    for code, want in enumerate(values):
        if not math.isfinite(want):
            continue
        kernel_code = code ^ offset
        x = conv.emulate(kernel_code)
        # SubtractOffset: fma2(x, 1, -(bias + offset)), one rounding in the compute type.
        got = _round(x * 1.0 - subtract, dt) if subtract else x
        if not _same(got, want):
            wrong.append((code, got, want))
    assert not wrong, f"{type(conv).__name__} for {name} -> {dt}: (code, got, want) {wrong[:8]}"


@pytest.mark.parametrize("name, dt", _pairs(with_converter=True))
def test_converter_choice(name: str, dt: str) -> None:
    """ints go through the magic number (8-bit into bf16 with the top bit apart), e0 floats through sign-magnitude,
    other floats by moving their fields."""
    fmt = FORMATS[name]
    conv = select_converter(fmt, dt)
    if fmt.is_int:
        expected = IntTopBitConvert if fmt.bits > MANTISSA_BITS[dt] else IntMagicConvert
    elif fmt.exponent_bits == 0:
        expected = SignMagnitudeConvert
    else:
        expected = FloatPlaceConvert
    assert type(conv) is expected
    assert conv.dtype == dt


@pytest.mark.parametrize("bits, dt", [(b, dt) for dt in DTYPES for b in range(1, 9) if b <= MANTISSA_BITS[dt]])
def test_int_magic_number_bit_trick(bits: int, dt: str) -> None:
    """code | magic (the or_bits lane) is the 16-bit float magic + code, for every code (wider codes than the
    mantissa go through IntTopBitConvert, tested below)."""
    conv = IntMagicConvert(bits=bits, dtype=dt)
    magic = int(conv.or_bits, 16)
    assert magic >> 16 == magic & 0xFFFF, "kMagic must hold the same constant in both lanes"
    for code in range(1 << bits):
        lane = code | (magic & 0xFFFF)
        as_int16 = lane - 0x10000 if lane & 0x8000 else lane
        value = torch.tensor([as_int16], dtype=torch.int16).view(TORCH_DTYPE[dt]).item()
        assert value == code + conv.bias == conv.emulate(code)


def test_int_top_bit_every_byte() -> None:
    """8-bit codes into bf16: every code comes out as code - 128, exactly (with garbage in the unread bits)."""
    conv = IntTopBitConvert(dtype="bfloat16")
    assert conv.bias == -128.0
    assert [conv.emulate(c) for c in range(256)] == [float(c - 128) for c in range(256)]
    assert [conv.emulate(c | 0x5A00) for c in range(256)] == [float(c - 128) for c in range(256)]


def test_int_top_bit_needs_an_odd_exponent() -> None:
    """fp16 would need 11-bit codes, and its -2^11 has an even exponent: flipping bit 10 does not give -2^10."""
    with pytest.raises(ValueError, match="does not give"):
        IntTopBitConvert(dtype="float16").extra_context()


@pytest.mark.parametrize("name, dt", _pairs(with_converter=False))
def test_no_exact_converter_raises(name: str, dt: str) -> None:
    fmt = FORMATS[name]
    with pytest.raises(ValueError) as info:
        select_converter(fmt, dt)
    msg = str(info.value)
    assert fmt.name in msg and dt in msg
    if dt == "float16" and _servable(fmt, "bfloat16"):
        assert "bfloat16" in msg  # points at the dtype that works


def test_rejections_are_the_formats_that_do_not_fit() -> None:
    """What is actually rejected: the formats whose range exceeds float16 (8, 7 and 6 exponent bits)."""
    rejected = {(p.values[0], p.values[1]) for p in _pairs(with_converter=False)}
    assert {("float8e6m1", "float16"), ("float8e8m0", "float16")} <= rejected, rejected
    assert all(dt == "float16" or not _servable(FORMATS[name], dt) for name, dt in rejected), \
        "every <= 8-bit format with subnormals fits bfloat16"
    for name, dt in rejected:
        assert not _servable(FORMATS[name], dt)
    with pytest.raises(ValueError, match="float8e7m0"):
        select_converter(dtype("float8e7m0"), "float16")


@pytest.mark.parametrize("name, dt", [pytest.param(n, d, id=f"{n}-{d}") for n in FORMATS for d in DTYPES])
def test_converter_exists_exactly_when_values_fit(name: str, dt: str) -> None:
    fmt = FORMATS[name]
    try:
        select_converter(fmt, dt)
        has = True
    except ValueError:
        has = False
    assert has == _servable(fmt, dt)


@pytest.mark.xfail(strict=True, reason="LIMITATION: FloatPlaceConvert needs source bias <= the compute type's "
                                       "bias, so a float whose values fit (e2m1 with bias 20 into float16: "
                                       "2^-20 .. 1.5 * 2^-17) is rejected although an exact conversion exists")
def test_large_bias_float_that_fits_is_served() -> None:
    fmt = FloatType(2, 1, bias=20)
    assert _exactly_representable(fmt, "float16")
    select_converter(fmt, "float16")


def test_compose_reports_the_converter_error() -> None:
    layer = LayerConfig(256, 256, QuantScheme("float8e8m0", granularity="channel", scale_dtype="float32"),
                        dtype="float16")
    tuning = TuningConfig(block_m=16, block_n=128, block_k=128, warps_n=2, warps_k=2)
    with pytest.raises(ComposeError, match=r"float8e8m0 .*float16"):
        compose(layer, ComputeConfig(), tuning, get_target("sm_90a"))
