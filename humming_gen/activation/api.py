"""`humming_gen.quantize_activation`: activations quantized on the GPU, into the layout GEMM kernels read."""

from __future__ import annotations

import torch

from humming_gen.activation.kernel import PARTIALS, ROW_WARPS_MAX_VECTORS, THREADS, QuantizeConfig, build
from humming_gen.schemes.quantize import MAX_PANEL_ROWS, PANEL_K, QuantizedActivation
from humming_gen.schemes.scheme import ActivationScheme
from humming_gen.targets import Target

_INPUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_SCALE_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_targets: dict[int, Target] = {}
_DEVICE_TYPES = ("cuda",)  # where the kernels run (CPU tests of the host path add "cpu", with launches stubbed)


def _target(device: torch.device) -> Target:
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _targets.get(index)
    if found is None:
        found = _targets[index] = Target.current(index)
    return found


class _Plan:
    """What quantize_activation decides once per (scheme, input dtype, target, static scale, 16-byte row loads):
    the kernels and the facts their launch needs."""

    __slots__ = ("scheme", "target", "kernel", "amax", "bits", "group", "tensor", "group_lanes", "vector",
                 "scale_torch", "config", "_row_warps")

    def __init__(self, scheme: ActivationScheme, dtype: torch.dtype, target: Target, static: bool, row_wide: bool,
                 hardware_convert: bool, panels: bool = False, dequantize: str | None = None):
        element_bytes = dtype.itemsize
        dtype_name = _INPUT_DTYPES[dtype]
        wide = row_wide and (scheme.granularity != "group" or scheme.group_size * element_bytes % 16 == 0)
        cfg = QuantizeConfig(scheme, dtype_name, target, static=static, wide=wide, hardware_convert=hardware_convert,
                             panels=panels, dequantize=dequantize)
        self.scheme, self.target, self.kernel, self.config = scheme, target, build(cfg), cfg
        self._row_warps = None  # per-token scales of short rows: one warp per row, built on first use
        self.amax = (build(QuantizeConfig(scheme, dtype_name, target, wide=row_wide, stage="amax"))
                     if cfg.needs_amax_pass else None)
        self.bits, self.group, self.tensor = scheme.dtype.bits, scheme.granularity == "group", \
            scheme.granularity == "tensor"
        self.group_lanes = cfg.group_lanes if cfg.kind == "quantize_group_lanes" else None
        self.vector = cfg.vector
        self.scale_torch = _SCALE_TORCH.get(scheme.scale_dtype.name, torch.uint8)

    def rows_kernel(self, k: int):
        """(kernel, rows per CTA) for rows of k elements: per-token scales of rows of at most ROW_WARPS_MAX_VECTORS
        vectors take a warp each (a CTA per such row left most of its warps idle: 32768 rows of 256 bf16 took 54-72
        us on the H200), every other row a CTA."""
        if self.scheme.granularity != "token" or -(-k // self.vector) > ROW_WARPS_MAX_VECTORS:
            return self.kernel, 1
        if self._row_warps is None:
            import attrs

            self._row_warps = build(attrs.evolve(self.config, row_warps=True))
        return self._row_warps, self._row_warps.config.rows_per_cta

    def row_bytes(self, k: int) -> int:
        """Bytes per row of codes (of 16-bit values for a dequantize plan)."""
        return 2 * k if self.config.dequantize else k if self.bits == 8 else k // 2

    def ldq(self, k: int) -> int:
        """Bytes per row of codes: rows 16-byte aligned."""
        return -(-self.row_bytes(k) // 16) * 16


_plans: dict[tuple, _Plan] = {}


def _plan(scheme: ActivationScheme, dtype: torch.dtype, target: Target, static: bool, row_wide: bool,
          hardware_convert: bool, panels: bool = False, dequantize: str | None = None) -> _Plan:
    """The cached plan (keyed by identity: hashing a scheme costs more than the rest of a call)."""
    key = (id(scheme), id(target), dtype, static, row_wide, hardware_convert, panels, dequantize)
    plan = _plans.get(key)
    if plan is None or plan.scheme is not scheme or plan.target is not target:
        if len(_plans) >= 256:  # a bound on memory (and on ids of collected schemes)
            _plans.clear()
        plan = _plans[key] = _Plan(scheme, dtype, target, static, row_wide, hardware_convert, panels, dequantize)
    return plan


LAYOUTS = ("rows", "panels")


def panel_layout_problem(scheme: ActivationScheme, shape: tuple[int, ...]) -> str | None:
    """Why activations of `shape` cannot be quantized into the "panels" layout (None when they can)."""
    if scheme.dtype.bits != 8:
        return f"the panels layout holds 8-bit codes, got {scheme.dtype.name}"
    if len(shape) != 2:
        return f"the panels layout takes (M, K) activations, got shape {tuple(shape)}"
    if shape[1] % PANEL_K:
        return f"the panels layout needs K a multiple of {PANEL_K}, got K = {shape[1]}"
    if shape[0] > MAX_PANEL_ROWS:
        return f"the panels layout holds at most {MAX_PANEL_ROWS} rows (a 32-bit panel stride), got {shape[0]}"
    return None


def _check_input(x: torch.Tensor, scheme: ActivationScheme, static_scale, who: str = "quantize_activation",
                 codes: bool = True) -> None:
    """ValueError / TypeError naming the argument before anything is launched (`codes`: 4-bit codes need an even K)."""
    if not isinstance(scheme, ActivationScheme):
        raise TypeError(f"{who}: activation_scheme must be an ActivationScheme, got "
                        f"{type(scheme).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"{who}: x.dtype is {x.dtype}; allowed: bfloat16, float16, float32")
    if x.dim() < 2:
        raise ValueError(f"{who}: x must be (..., M, K) with at least 2 dims, got shape "
                         f"{tuple(x.shape)}")
    if x.device.type not in _DEVICE_TYPES:
        raise ValueError(f"{who}: x is on {x.device}; the kernels run on a CUDA device")
    k = x.shape[-1]
    if k < 1 or x.numel() == 0:
        raise ValueError(f"{who}: x has shape {tuple(x.shape)}; K and M must be >= 1")
    if k >= 2 ** 31:
        raise ValueError(f"{who}: K = {k} is above the kernels' 32-bit column index")
    if x.stride(-1) != 1:
        raise ValueError(f"{who}: x must have unit stride along K (row-major rows), got strides "
                         f"{x.stride()}")
    try:
        if x.dim() != 2:  # (m, k) rows of unit column stride always have one row stride
            x.view(-1, k)
    except RuntimeError:
        raise ValueError(f"{who}: the leading dims of x must flatten to rows of one stride, got "
                         f"shape {tuple(x.shape)} strides {x.stride()}; pass x.contiguous()") from None
    if codes and scheme.dtype.bits == 4 and k % 2:
        raise ValueError(f"{who}: 4-bit codes are stored two per byte, so K must be even, got {k}")
    if static_scale is not None:
        if not isinstance(static_scale, torch.Tensor) or static_scale.numel() != 1:
            raise ValueError(f"{who}: static_scale must be a one-element tensor (a checkpoint's "
                             "input_scale)")
        if static_scale.device != x.device:
            raise ValueError(f"{who}: static_scale is on {static_scale.device}, x on {x.device}")


def _row_matrix(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(x as the (m, k) row matrix the kernels read, whether they may take 16-byte loads of it): an (m, k) x is its
    own row matrix, except one row, whose stride view() sets to k; 16-byte loads where K, the row stride and the
    start allow them (the amax pass reads whole rows; the quantize kernel also needs whole vectors per group)."""
    k = x.shape[-1]
    x2 = x if x.dim() == 2 and (x.shape[0] != 1 or x.stride(0) == k) else x.view(-1, k)
    size = x.element_size()
    return x2, k * size % 16 == 0 and x2.stride(0) * size % 16 == 0 and x2.data_ptr() % 16 == 0


def quantize_activation(x: torch.Tensor, activation_scheme: ActivationScheme,
                        static_scale: torch.Tensor | None = None, *,
                        hardware_convert: bool = True, layout: str = "rows") -> QuantizedActivation:
    """Quantize activations x (..., K) on the GPU with `activation_scheme`, on torch's current stream.

    The codes and scales are bit-identical to `activation_scheme.quantize(x)` (docs/FORMATS.md 4.1 states the
    ties argument); they come back in the kernel layout of `QuantizedActivation` (layout "kernel": codes row-major,
    rows 16-byte aligned, 4-bit codes two per byte low nibble first; scales (..., groups) row-major in the scale
    dtype's raw bits). `.to_reference()` gives the reference layout.

    layout: "rows" (the kernel layout above), or "panels": 8-bit codes of (M, K) x with K a multiple of 128 as a
        (K / 128, M, 128) uint8 tensor, row r's 16-byte chunk c of panel p at codes[p, r, 16 * (c ^ (r % 8))]
        (QuantizedActivation layout "panels"): wgmma's 128-byte-swizzled K-major layout, which the
        warp-specialized 8-bit GEMMs (TuningConfig.a_load='tma') copy a stage of in one bulk copy.

    static_scale: a checkpoint's per-tensor input_scale (one-element fp32 tensor on x's device): the per-tensor
        scale of granularity "tensor", or the global scale of an NVFP4 scheme. None: computed from x, by a
        second kernel (tensor_amax) before the quantize kernel, without a host sync.
    hardware_convert: False runs the software rounding where the target has a cvt instruction (tests).

    Raises ValueError / TypeError naming the argument (dtype bf16 / fp16 / fp32, >= 2 dims with unit stride along
    K, CUDA device, K even for 4-bit codes, a scheme the kernels serve) before anything is launched.
    """
    _check_input(x, activation_scheme, static_scale)
    if layout not in LAYOUTS:
        raise ValueError(f"quantize_activation: layout is {layout!r}; allowed: {LAYOUTS}")
    panels = layout == "panels"
    problem = panel_layout_problem(activation_scheme, tuple(x.shape)) if panels else None
    if problem:
        raise ValueError(f"quantize_activation: layout='panels': {problem}")
    scheme = activation_scheme
    device = x.device
    k = x.shape[-1]
    x2, row_wide = _row_matrix(x)
    m = x2.shape[0]
    static = static_scale is not None
    plan = _plan(scheme, x.dtype, _target(device), static, row_wide, hardware_convert, panels)

    if panels:
        codes = torch.empty((k // PANEL_K, m, PANEL_K), dtype=torch.uint8, device=device)
    else:
        codes = torch.empty((m, plan.ldq(k)), dtype=torch.uint8, device=device)
    groups = -(-k // scheme.group_size) if plan.group else 1
    values = {"x": x2.data_ptr(), "ldx": x2.stride(0), "codes": codes.data_ptr(), "ldq": codes.stride(0), "m": m,
              "k": k, "groups": groups}
    global_scale = None
    if plan.tensor and static:
        scales = static_scale.reshape((1,) * x.dim()).to(torch.float32)
        values["tensor_scale"] = scales.data_ptr()
    else:
        scales = torch.empty((1 if plan.tensor else m, groups), dtype=plan.scale_torch, device=device)
        values["scales"] = scales.data_ptr()
        if x.dim() != 2:
            scales = scales.reshape((1,) * x.dim()) if plan.tensor else scales.reshape(*x.shape[:-1], groups)
    if scheme.global_scale:
        global_scale = (static_scale.reshape(()).to(torch.float32) if static
                        else torch.empty((), dtype=torch.float32, device=device))
        values["global_scale"] = global_scale.data_ptr()
    _launch(plan, values, m, k, groups, device)
    if panels:
        return QuantizedActivation(scheme, codes, scales, global_scale, layout="panels")
    row_bytes = plan.row_bytes(k)
    if row_bytes != codes.shape[1]:
        codes = codes[:, :row_bytes]
    if x.dim() != 2:
        codes = codes.reshape(*x.shape[:-1], row_bytes)
    return QuantizedActivation(scheme, codes, scales, global_scale, layout="kernel")


def _launch(plan: _Plan, values: dict[str, int], m: int, k: int, groups: int, device: torch.device) -> None:
    """The plan's kernels on filled Params values: the amax pass where the scale needs one, then the quantize kernel."""
    index = device.index or 0
    if plan.amax is not None:
        partials = torch.empty(PARTIALS, dtype=torch.float32, device=device)
        values["partials"] = partials.data_ptr()
        plan.amax.launch(PARTIALS, values, index)
    if plan.group_lanes:
        row_vectors = -(-k // plan.vector)
        row_vectors = values["row_vectors"] = -(-row_vectors // plan.group_lanes) * plan.group_lanes
        grid = -(-m * row_vectors // 256)
        plan.kernel.launch(grid, values, index)
    elif plan.group:
        plan.kernel.launch(-(-m * groups // 256), values, index)
    else:
        kernel, rows_per_cta = plan.rows_kernel(k)
        kernel.launch(-(-m // rows_per_cta), values, index)


_VALUE_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def fake_quantize_activation(x: torch.Tensor, activation_scheme: ActivationScheme,
                             static_scale: torch.Tensor | None = None, *, dtype: torch.dtype = torch.bfloat16,
                             hardware_convert: bool = True) -> torch.Tensor:
    """The values of x quantized with `activation_scheme`, as a (..., K) tensor of `dtype` (bfloat16 or float16),
    by one kernel on torch's current stream (two for a dynamic per-tensor scale).

    Bit-identical to `activation_scheme.quantize(x).dequantize(dtype)` (each element's decode(code) * scale,
    converted as torch converts the float64 product: to fp32, then to nearest in `dtype`) on the same input, except
    that NaN elements come out as the CUDA conversion's canonical NaN. With e8m0 scales every value of an 8-bit
    element is exact in bfloat16 (a code of at most 7 significant bits times a power of two), unless it falls below
    bf16's normal range (2^-126), which takes a group scale below 2^-110; so 16-bit GEMMs on these values compute
    the products of the quantized GEMM (QuantLinear's dequantize_activations). In float16 values can round past its
    range (65504) to inf. The scales are computed but not returned. Schemes with a global scale (NVFP4) are refused;
    4-bit elements take any K (their values are stored as 16-bit values, not packed codes).
    """
    if dtype not in _VALUE_DTYPES:
        raise ValueError(f"fake_quantize_activation: dtype is {dtype}; allowed: torch.bfloat16, torch.float16")
    if isinstance(activation_scheme, ActivationScheme) and activation_scheme.global_scale:
        raise ValueError("fake_quantize_activation: schemes with a global scale (NVFP4) are not served; use "
                         "quantize_activation(...).dequantize(dtype)")
    _check_input(x, activation_scheme, static_scale, "fake_quantize_activation", codes=False)
    scheme = activation_scheme
    device = x.device
    k = x.shape[-1]
    x2, row_wide = _row_matrix(x)
    m = x2.shape[0]
    static = static_scale is not None
    plan = _plan(scheme, x.dtype, _target(device), static, row_wide, hardware_convert, False, _VALUE_DTYPES[dtype])
    out = torch.empty((m, k), dtype=dtype, device=device)
    groups = -(-k // scheme.group_size) if plan.group else 1
    values = {"x": x2.data_ptr(), "ldx": x2.stride(0), "codes": out.data_ptr(), "ldq": out.stride(0) * 2, "m": m,
              "k": k, "groups": groups}
    if plan.tensor and static:
        scale = static_scale.reshape(1).to(torch.float32)
        values["tensor_scale"] = scale.data_ptr()
    else:
        scales = torch.empty((1 if plan.tensor else m, groups), dtype=plan.scale_torch, device=device)
        values["scales"] = scales.data_ptr()
    _launch(plan, values, m, k, groups, device)
    return out.view(x.shape)


class RowQuantizer:
    """quantize_activation's launch bound to one layer's rows (scheme, input dtype, K, static scale fixed), for the
    eager hot path of QuantLinear: no argument checks (the layer checked x), no result objects, and codes and scales
    in one allocation (codes: m rows of `ldq` bytes, then the m x groups scales). The same kernel and Params as
    quantize_activation, so the same bits. Serves what one kernel launch quantizes: per-token or per-group scales
    (fp32, 16-bit or e8m0; no global scale), or a static per-tensor scale, on rows of 16-byte aligned loads; `create`
    returns None for anything else (the caller keeps quantize_activation). `panels`: codes in the panels layout
    (quantize_activation(layout="panels")), whose panel stride `lda(m)` gives."""

    __slots__ = ("ldq", "kernel", "threads_per_row", "rows_per_cta", "values", "index", "scale_bytes", "keep",
                 "panels", "scale_dtype")

    def __init__(self, plan: _Plan, k: int, index: int, static_scale: torch.Tensor | None):
        self.ldq = plan.ldq(k)
        self.panels = plan.config.panels
        self.index = index
        groups = -(-k // plan.scheme.group_size) if plan.group else 1
        self.values = {"ldq": self.ldq, "k": k, "groups": groups}
        if plan.group:  # a thread per vector (lanes share a group) or per group, over m rows: a grid of THREADS
            self.kernel, self.rows_per_cta = plan.kernel, 0
            self.threads_per_row = groups
            if plan.group_lanes:
                vectors = -(-k // plan.vector)
                row_vectors = -(-vectors // plan.group_lanes) * plan.group_lanes  # (as quantize_activation)
                self.values["row_vectors"] = self.threads_per_row = row_vectors
        else:  # a CTA (or warp) per row
            self.kernel, self.rows_per_cta = plan.rows_kernel(k)
            self.threads_per_row = 0
        self.scale_dtype = plan.scale_torch  # the scales' raw bits as quantize_activation returns them
        scale_size = plan.scale_torch.itemsize
        self.scale_bytes = 0 if static_scale is not None else groups * scale_size
        self.keep = None
        if static_scale is not None:
            self.keep = static_scale.reshape(1).to(torch.float32).contiguous()  # alive as long as the values point at it
            self.values["tensor_scale"] = self.keep.data_ptr()

    @staticmethod
    def create(scheme: ActivationScheme, dtype: torch.dtype, k: int, device: torch.device,
               static_scale: torch.Tensor | None, panels: bool = False,
               dequantize: str | None = None) -> "RowQuantizer | None":
        """dequantize: bind fake_quantize_activation's launch instead (`tensors` then returns the (m, ldq) bytes of
        the 16-bit values, rows 2K bytes apart: `.view(dtype)` is the (m, K) values)."""
        static = static_scale is not None
        if (scheme.granularity not in ("token", "tensor", "group") or (scheme.granularity == "tensor") != static
                or scheme.global_scale or scheme.dtype.bits != 8 or dtype not in _INPUT_DTYPES
                or k * dtype.itemsize % 16 or device.type not in _DEVICE_TYPES or (panels and k % PANEL_K)):
            return None
        plan = _plan(scheme, dtype, _target(device), static, True, True, panels, dequantize)
        if plan.amax is not None:
            return None
        return RowQuantizer(plan, k, device.index or 0, static_scale)

    def lda(self, m: int) -> int:
        """The GEMM's activation stride for m rows: bytes per row, or per panel (m * 128) in the panels layout."""
        return m * PANEL_K if self.panels else self.ldq

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """Quantize (m, K) rows x (unit column stride, rows 16-byte aligned): (buffer, codes pointer, scales
        pointer). The buffer holds codes and scales; keep it until the GEMM is launched (torch's allocator orders
        its reuse after the kernels of this stream)."""
        m = x.shape[0]
        buf = torch.empty(m * (self.ldq + self.scale_bytes), dtype=torch.uint8, device=x.device)
        codes = buf.data_ptr()
        scales = self.values["tensor_scale"] if self.scale_bytes == 0 else codes + m * self.ldq
        self._launch(x, m, codes, scales)
        return buf, codes, scales

    def tensors(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """__call__ for callers that pass tensors on (QuantMoE's launchers): (codes (m, ldq) uint8, scales (m,
        groups) in the scale dtype's raw bits, or the static per-tensor scale), as quantize_activation's rows."""
        m = x.shape[0]
        codes = torch.empty((m, self.ldq), dtype=torch.uint8, device=x.device)
        scales = self.keep if self.scale_bytes == 0 else torch.empty(
            (m, self.values["groups"]), dtype=self.scale_dtype, device=x.device)
        self._launch(x, m, codes.data_ptr(), scales.data_ptr())
        return codes, scales

    def _launch(self, x: torch.Tensor, m: int, codes: int, scales: int) -> None:
        values = self.values
        values["x"], values["ldx"], values["codes"], values["m"] = x.data_ptr(), x.stride(0), codes, m
        if self.panels:
            values["ldq"] = m * PANEL_K
        values["scales"] = scales
        grid = -(-m * self.threads_per_row // THREADS) if self.threads_per_row else -(-m // self.rows_per_cta)
        self.kernel.launch(grid, values, self.index)
