"""Define new number formats in a few lines, compare them with the built-in presets, and generate kernels.

Registers a 5-bit float (1 sign, 3 exponent, 1 mantissa bits) and a 5-bit unsigned int used with a zero
point, quantizes one random weight with several schemes, and prints the weight error and the error of the
whole product y = x . W^T (activations quantized as each scheme says) against the unquantized float64 GEMM.
Then it generates and compiles the kernels of the two new formats for sm_90a (no GPU needed) and, with a GPU,
runs them through QuantLinear against the float64 reference.

Run: python examples/custom_format.py
"""

import torch

import humming_gen as hg
from humming_gen.formats import FloatType, IntType, dtype, register_dtype
from humming_gen.reference import reference_gemm
from humming_gen.schemes.presets import preset
from humming_gen.schemes.scheme import ActivationScheme, QuantScheme

# --- 1. two new formats: that is all a format needs ------------------------------------------------------------
fp5 = register_dtype("fp5_e3m1", FloatType(exponent_bits=3, mantissa_bits=1))
u5 = register_dtype("u5", IntType(bits=5, signed=False))

positive = sorted({v for v in fp5.code_values().tolist() if v >= 0})
print(f"{fp5.name}: {fp5.bits} bits, max {fp5.max_finite}, smallest {fp5.min_subnormal}, "
      f"values >= 0: {positive}")
print(f"{u5.name}: codes 0..{u5.max_value}; float8e4m3 carries fp5_e3m1 exactly: "
      f"{dtype('float8e4m3').represents(fp5)}, int8 carries u5: {dtype('int8').represents(u5)}\n")

# --- 2. schemes: presets next to schemes built on the new formats ---------------------------------------------
schemes = {name: preset(name) for name in ("w4a16-int4-g128", "w4a16-int4-g128-zp", "w4a16-mxfp4",
                                            "w4a4-nvfp4", "w8a16-int8-channel", "w8a8-fp8-channel")}
schemes["w5a16-fp5_e3m1-g32"] = QuantScheme("fp5_e3m1", group_size=32, scale_dtype="bfloat16")
schemes["w5a16-mx-fp5_e3m1"] = QuantScheme("fp5_e3m1", group_size=32, scale_dtype="float8e8m0")
schemes["w5a16-u5-g128-zp"] = QuantScheme("u5", group_size=128, zero_point="int")
schemes["w5a16-u5-g128-fzp"] = QuantScheme("u5", group_size=128, zero_point="float")
schemes["w5a8-fp5_e3m1-g32-fp8"] = QuantScheme("fp5_e3m1", group_size=32,
                                               activation=ActivationScheme("float8e4m3", granularity="token"))

# --- 3. quantize one weight with each and measure ----------------------------------------------------------------
torch.manual_seed(0)
n, k, m = 512, 1000, 16  # K = 1000 is not a multiple of 128: the last group is partial
w = torch.randn(n, k) * 0.02
x = torch.randn(m, k)
exact = x.double() @ w.double().T


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


print(f"{'scheme':24s} {'weight':>10s} {'W rel err':>10s} {'GEMM rel err':>13s}  summary")
for name, scheme in schemes.items():
    q = scheme.quantize(w)
    y = reference_gemm(x, q)  # float64 oracle: quantized activations x dequantized weights
    print(f"{name:24s} {scheme.weight.name:>10s} {rel(q.dequantize(), w):10.4f} {rel(y, exact):13.4f}  "
          f"{scheme.summary()}")

# --- 4. kernels for the new formats: generated, compiled, and (with a GPU) run ---------------------------------
print()
for name in ("w5a16-fp5_e3m1-g32", "w5a16-u5-g128-zp"):
    kernel = hg.compile(hg.LayerConfig(n=n, k=k, scheme=schemes[name]), target="sm_90a", m=m)
    print(f"{name}: {kernel.name} ({len(kernel.source.splitlines())} lines, {kernel.resources.get('registers')} regs)")
    if torch.cuda.is_available():
        q = schemes[name].quantize(w.cuda())
        layer = hg.QuantLinear.from_quantized(q, dtype=torch.bfloat16)
        xb = x.cuda().bfloat16()
        print(f"    on {torch.cuda.get_device_name()}: kernel vs float64 reference "
              f"{rel(layer(xb), reference_gemm(xb.double(), q)):.2e}")
