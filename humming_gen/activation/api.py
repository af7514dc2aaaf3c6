"""`humming_gen.quantize_activation`: activations quantized on the GPU, into the layout GEMM kernels read."""

from __future__ import annotations

import math

import torch

from humming_gen.activation.kernel import PARTIALS, QuantizeConfig, build
from humming_gen.schemes.quantize import QuantizedActivation
from humming_gen.schemes.scheme import ActivationScheme
from humming_gen.targets import Target

_INPUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_SCALE_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_targets: dict[int, Target] = {}


def _target(device: torch.device) -> Target:
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _targets.get(index)
    if found is None:
        found = _targets[index] = Target.current(index)
    return found


def _check_input(x: torch.Tensor, scheme: ActivationScheme, static_scale) -> None:
    """ValueError / TypeError naming the argument before anything is launched."""
    if not isinstance(scheme, ActivationScheme):
        raise TypeError(f"quantize_activation: activation_scheme must be an ActivationScheme, got "
                        f"{type(scheme).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize_activation: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"quantize_activation: x.dtype is {x.dtype}; allowed: bfloat16, float16, float32")
    if x.dim() < 2:
        raise ValueError(f"quantize_activation: x must be (..., M, K) with at least 2 dims, got shape "
                         f"{tuple(x.shape)}")
    if x.device.type != "cuda":
        raise ValueError(f"quantize_activation: x is on {x.device}; the kernels run on a CUDA device")
    k = x.shape[-1]
    if k < 1 or x.numel() == 0:
        raise ValueError(f"quantize_activation: x has shape {tuple(x.shape)}; K and M must be >= 1")
    if k >= 2 ** 31:
        raise ValueError(f"quantize_activation: K = {k} is above the kernels' 32-bit column index")
    if x.stride(-1) != 1:
        raise ValueError(f"quantize_activation: x must have unit stride along K (row-major rows), got strides "
                         f"{x.stride()}")
    try:
        x.view(-1, k)
    except RuntimeError:
        raise ValueError(f"quantize_activation: the leading dims of x must flatten to rows of one stride, got "
                         f"shape {tuple(x.shape)} strides {x.stride()}; pass x.contiguous()") from None
    if scheme.dtype.bits == 4 and k % 2:
        raise ValueError(f"quantize_activation: 4-bit codes are stored two per byte, so K must be even, got {k}")
    if static_scale is not None:
        if not isinstance(static_scale, torch.Tensor) or static_scale.numel() != 1:
            raise ValueError("quantize_activation: static_scale must be a one-element tensor (a checkpoint's "
                             "input_scale)")
        if static_scale.device != x.device:
            raise ValueError(f"quantize_activation: static_scale is on {static_scale.device}, x on {x.device}")


def quantize_activation(x: torch.Tensor, activation_scheme: ActivationScheme,
                        static_scale: torch.Tensor | None = None, *,
                        hardware_convert: bool = True) -> QuantizedActivation:
    """Quantize activations x (..., K) on the GPU with `activation_scheme`, on torch's current stream.

    The codes and scales are bit-identical to `activation_scheme.quantize(x)` (docs/FORMATS.md 4.1 states the
    ties argument); they come back in the kernel layout of `QuantizedActivation` (layout "kernel": codes row-major,
    rows 16-byte aligned, 4-bit codes two per byte low nibble first; scales (..., groups) row-major in the scale
    dtype's raw bits). `.to_reference()` gives the reference layout.

    static_scale: a checkpoint's per-tensor input_scale (one-element fp32 tensor on x's device): the per-tensor
        scale of granularity "tensor", or the global scale of an NVFP4 scheme. None: computed from x, by a
        second kernel (tensor_amax) before the quantize kernel, without a host sync.
    hardware_convert: False runs the software rounding where the target has a cvt instruction (tests).

    Raises ValueError / TypeError naming the argument (dtype bf16 / fp16 / fp32, >= 2 dims with unit stride along
    K, CUDA device, K even for 4-bit codes, a scheme the kernels serve) before anything is launched.
    """
    _check_input(x, activation_scheme, static_scale)
    scheme = activation_scheme
    device = x.device
    k = x.shape[-1]
    x2 = x.view(-1, k)
    m = x2.shape[0]
    target = _target(device)
    dtype_name = _INPUT_DTYPES[x.dtype]
    element_bytes = x.element_size()
    vector_bytes = 16
    wide = (k * element_bytes % vector_bytes == 0 and x2.stride(0) * element_bytes % vector_bytes == 0
            and x2.data_ptr() % vector_bytes == 0
            and (scheme.granularity != "group" or scheme.group_size * element_bytes % vector_bytes == 0))
    static = static_scale is not None
    cfg = QuantizeConfig(scheme, dtype_name, target, static=static, wide=wide, hardware_convert=hardware_convert)
    # the amax pass reads whole rows: 16-byte loads whenever x allows them
    row_wide = wide or (k * element_bytes % vector_bytes == 0 and x2.stride(0) * element_bytes % vector_bytes == 0
                        and x2.data_ptr() % vector_bytes == 0)

    row_bytes = k if scheme.dtype.bits == 8 else k // 2
    ldq = -(-row_bytes // 16) * 16
    codes = torch.empty((m, ldq), dtype=torch.uint8, device=device)
    lead = tuple(x.shape[:-1])
    groups = math.ceil(k / scheme.group_size) if scheme.granularity == "group" else 1
    sd = scheme.scale_dtype
    scale_torch = _SCALE_TORCH.get(sd.name, torch.uint8)
    values = {"x": x2.data_ptr(), "ldx": x2.stride(0), "codes": codes.data_ptr(), "ldq": ldq, "m": m, "k": k,
              "groups": groups}
    global_scale = None
    if scheme.granularity == "tensor" and static:
        scales = static_scale.reshape((1,) * x.dim()).to(torch.float32)
        values["tensor_scale"] = scales.data_ptr()
    else:
        rows = 1 if scheme.granularity == "tensor" else m
        scales = torch.empty((rows, groups), dtype=scale_torch, device=device)
        values["scales"] = scales.data_ptr()
        scales = scales.reshape((1,) * x.dim()) if scheme.granularity == "tensor" else scales.reshape(*lead, groups)
    if scheme.global_scale:
        global_scale = (static_scale.reshape(()).to(torch.float32) if static
                        else torch.empty((), dtype=torch.float32, device=device))
        values["global_scale"] = global_scale.data_ptr()
    if cfg.needs_amax_pass:
        partials = torch.empty(PARTIALS, dtype=torch.float32, device=device)
        values["partials"] = partials.data_ptr()
        amax = build(QuantizeConfig(scheme, dtype_name, target, wide=row_wide, stage="amax"))
        amax.launch(PARTIALS, values, device.index or 0)
    kernel = build(cfg)
    if cfg.kind == "quantize_rows":
        grid = m
    elif cfg.kind == "quantize_group_lanes":
        row_vectors = -(-k // cfg.vector)
        row_vectors = -(-row_vectors // cfg.group_lanes) * cfg.group_lanes
        values["row_vectors"] = row_vectors
        grid = -(-m * row_vectors // 256)
    else:
        grid = -(-m * groups // 256)
    kernel.launch(grid, values, device.index or 0)
    codes = codes[:, :row_bytes].reshape(*lead, row_bytes) if m else codes
    return QuantizedActivation(scheme, codes, scales, global_scale, layout="kernel")
