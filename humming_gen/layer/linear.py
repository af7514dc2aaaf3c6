"""QuantLinear: a torch module running a quantized dense layer through generated kernels, one per M bucket."""

from __future__ import annotations

import torch

import attrs

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import TuningPlan, choose_tunings
from humming_gen.layer.compute_type import ComputeChoice, kernel_reasons, resolve, value_activation_scheme
from humming_gen.layer.eager import direct_call
from humming_gen.layer.ops import register_layer, run_gemm, run_gemm_out
from humming_gen.layer.weights import (PreparedWeight, fold_serves, layout_key, prepare_weight, resolve_device,
                                      scales_fold, static_input_scale)
from humming_gen.schemes import QuantizedWeight, QuantScheme
from humming_gen.schemes.quantize import MAX_PANEL_ROWS
from humming_gen.targets import Target

_DTYPE_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_OUT_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_INT32_MAX = 2**31 - 1  # the kernels' lda / ldc are 32-bit ints


def _as_rows(t: torch.Tensor, cols: int) -> torch.Tensor | None:
    """t (..., cols) as an (m, cols) view with unit column stride, or None when no single row stride exists."""
    if t.dim() == 2:
        rows = t
    else:
        try:
            rows = t.view(-1, cols)
        except RuntimeError:
            return None
    return rows if rows.stride(1) == 1 or cols == 1 else None


class QuantLinear(torch.nn.Module):
    """y = x @ W^T (+ bias) with W quantized. Build with `from_float` or `from_quantized`.

    All kernels (one per M bucket of the heuristics) are compiled in parallel at construction and share one
    packed copy of the weight; `forward` picks the kernel for the batch's row count. A scheme that also quantizes
    activations (FP8, W4A8, NVFP4 checkpoints) runs them quantized where the target's kernels serve them, else
    falls back (fp4 -> fp8 -> 16-bit, logged once, `compute_dtype` says which runs; strict=True refuses);
    weight_only=True always runs 16-bit activations.
    batch_invariant=True: row r's output is bitwise the same for every batch size (heuristics/batch_invariant.py).
    MXFP4-style e8m0 group scales fold into the e4m3 weights of the warp-specialized 8-bit kernels where every row's
    exponents allow it (`fold_scales` says whether they do; humming_gen.components.numeric.exponent_fold).
    dequantize_activations: True runs the scheme's quantized activations as 16-bit values (fake_quantize_activation,
    bit-identical to scheme.activation.quantize(x).dequantize(dtype)) on the 16-bit kernels, on any target; None
    (default) does so for fp8 activations in groups shorter than 128 (MXFP8: exact values; fp32 scales: values
    rounded to bf16) on sm_90a in bf16 layers, 1.6-2x faster from M = 256 but up to 5 us slower at M <= 16 on small
    layers (`compute_type.dequantized_activations_default`), unless strict=True, explicit tunings, quantize_in_gemm,
    batch_invariant or weight_only pin the kernels; False keeps the 8-bit kernels. `value_scheme` says which runs
    (None: the 8-bit kernels, or no activation quantization).
    quantize_in_gemm=True (opt-in; more GPU time on the H200, README): buckets of M <= 16 with dynamic per-token
    or static per-tensor fp8 / int8 activations run standard-pipeline kernels that quantize x in their loader
    (TuningConfig.a_load='quantize'): one launch per call instead of two, no codes or scales allocated
    (`quantizes_in_gemm` lists the buckets).
    """

    def __init__(self, qweight: QuantizedWeight, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16, *, target: "Target | str | None" = None,
                 device: "torch.device | str | None" = None, tunings: TuningPlan | None = None,
                 out_dtype: torch.dtype | None = None, compiler: str | None = None, weight_only: bool = False,
                 batch_invariant: bool = False, strict: bool = False, quantize_in_gemm: bool = False,
                 dequantize_activations: bool | None = None):
        super().__init__()
        from humming_gen.codegen import compose
        from humming_gen.kernel import _resolve_target, build_many

        if not isinstance(qweight, QuantizedWeight):
            raise TypeError(f"qweight must be a QuantizedWeight, got {type(qweight).__name__}")
        if dtype not in _DTYPE_NAME:
            raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        if qweight.codes.dim() != 2:
            raise ValueError(f"QuantLinear takes a (N, K) weight; got codes of shape {tuple(qweight.codes.shape)} "
                             f"(MoE weights need QuantMoE)")
        out_dtype = out_dtype or dtype
        if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
        self.in_features, self.out_features = qweight.k, qweight.n
        self.dtype = dtype
        self.out_dtype = out_dtype
        self.target = _resolve_target(target)
        self.compute_config = ComputeConfig(batch_invariant=batch_invariant)
        #: the activation scheme whose values (fake_quantize_activation) the 16-bit kernels run on, where the layer
        #: dequantizes activations (dequantize_activations; compute_type.dequantized_activations_default)
        self.value_scheme = value_activation_scheme(qweight.scheme, _DTYPE_NAME[dtype], self.target,
                                                    dequantize_activations, weight_only=weight_only,
                                                    quantize_in_gemm=quantize_in_gemm,
                                                    batch_invariant=batch_invariant, strict=strict,
                                                    tunings_given=tunings is not None,
                                                    static_scale=qweight.input_scale is not None)
        if self.value_scheme is not None:
            choice = ComputeChoice(attrs.evolve(qweight.scheme, activation=None), _DTYPE_NAME[dtype], ())
        else:
            choice = resolve(qweight.scheme, _DTYPE_NAME[dtype], self.target.name,
                             lambda s: self._quantized_activation_reasons(qweight, s, bias is not None, out_dtype),
                             strict=strict, weight_only=weight_only, who="QuantLinear",
                             emulated_mma=self.target.emulated_mma)
        #: the activation type the MMA multiplies ("float8e4m3", "int8", or the 16-bit dtype where activations
        #: are not quantized); may be a fallback from the scheme's own (humming_gen.layer.compute_type)
        self.compute_dtype: str = choice.compute_dtype
        self.fallback_reasons = choice.reasons
        own_activation = qweight.scheme.activation  # the checkpoint's (its input_scale belongs to it)
        if choice.scheme.activation != own_activation:
            qweight = attrs.evolve(qweight, scheme=choice.scheme)
        #: the scheme whose arithmetic the layer computes (with the fallback's activation where it falls back; the
        #: value scheme's where the 16-bit kernels run its dequantized activations, layer_config.scheme's without)
        self.scheme: QuantScheme = (qweight.scheme if self.value_scheme is None
                                    else attrs.evolve(qweight.scheme, activation=self.value_scheme))
        self.layer_config = LayerConfig(n=qweight.n, k=qweight.k, scheme=qweight.scheme, has_bias=bias is not None,
                                        dtype=_DTYPE_NAME[dtype], out_dtype=_OUT_NAME[out_dtype],
                                        fold_scales=scales_fold(qweight))
        self.activation_scheme = qweight.scheme.activation  # None: 16-bit activations
        self._static_scale = None  # a checkpoint's per-tensor input_scale, used as the activation scale
        act = self.scheme.activation  # what the layer quantizes x with (8-bit kernels or values)
        if (act is not None and act == own_activation and qweight.input_scale is not None
                and act.granularity == "tensor"):
            self._static_scale = static_input_scale(qweight.input_scale, "QuantLinear: qweight")
        self.tunings = tunings or choose_tunings(self.layer_config, self.target, batch_invariant=batch_invariant)
        if self.fold_scales and not fold_serves(self.layer_config, self.tunings, self.target):
            self.layer_config = attrs.evolve(self.layer_config, fold_scales=False)
            if tunings is None:  # the unfolded layer's own stored winners: the folded key's were timed folded
                self.tunings = choose_tunings(self.layer_config, self.target, batch_invariant=batch_invariant)
        if quantize_in_gemm and self.activation_scheme is not None and not batch_invariant:
            from humming_gen.pipelines.standard.compose_a8 import quantize_a_plan

            fused = quantize_a_plan(self.tunings, self.layer_config, self.target,
                                    static_scale=self._static_scale is not None)
            if tunings is None and fused != self.tunings and any(t.b_operand == "shared" for t in fused.tunings()):
                # the fusing buckets are the standard pipeline's, which read the register weights' packed layout
                fused = quantize_a_plan(choose_tunings(self.layer_config, self.target, register_weights=True),
                                        self.layer_config, self.target, static_scale=self._static_scale is not None)
            self.tunings = fused
        if batch_invariant:
            from humming_gen.heuristics.batch_invariant import check_batch_invariant

            check_batch_invariant(self.layer_config, self.tunings, self.target, self._static_scale is not None)
        plans = {t: compose(self.layer_config, self.compute_config, t, self.target) for t in self.tunings.tunings()}
        keys = {layout_key(p) for p in plans.values()}
        if len(keys) != 1:
            raise ValueError("the tunings of a QuantLinear must share one weight layout (block_n, warps_n and "
                             "block_k / warps_k)")
        kernels = build_many(list(plans.values()), compiler=compiler)
        self._kernels = dict(zip(plans, kernels))
        self._buckets = [(m_max, self._kernels[t]) for m_max, t in self.tunings.buckets]
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = resolve_device(device)
        self.weight: PreparedWeight = prepare_weight(next(iter(plans.values())), qweight, self.device)
        if self._static_scale is not None:
            self._static_scale = self._static_scale.to(self.device)
        self.bias = None
        if bias is not None:
            if bias.shape != (qweight.n,):
                raise ValueError(f"bias must have shape ({qweight.n},), got {tuple(bias.shape)}")
            self.bias = bias.detach().to(self.device, dtype).contiguous()
        # One launcher per bucket, with weights, scales, bias and split-K scratch bound once.
        self._launchers = [(m_max, kernel.bind(self.weight, self.bias, self.device, m_max))
                           for m_max, kernel in self._buckets]
        #: per bucket: its kernel reads x and quantizes it in its loader (TuningConfig.a_load='quantize'), so
        #: forward launches it on x alone (no quantize_activation kernel, no codes or scales allocated)
        self.quantizes_in_gemm = [t.a_load == "quantize" for _, t in self.tunings.buckets]
        # per bucket: the layout its kernel reads activation codes in ("rows", or "panels": Kernel.activation_layout)
        self._code_layouts = [kernel.activation_layout for _, kernel in self._buckets]
        # the eager quantize launches bound to this layer (humming_gen.activation.api.RowQuantizer), per codes layout
        # its buckets read ("rows", "panels"; "values": the value route's), made on the first quantized call of each
        # (None: the scheme needs quantize_activation's or fake_quantize_activation's general path)
        self._row_quantizers: dict[str, object] = {}
        self._op_id = register_layer(self)  # the key of this layer in the humming_gen::gemm op

    def _quantized_activation_reasons(self, qweight: QuantizedWeight, scheme: QuantScheme, has_bias: bool,
                                      out_dtype: torch.dtype) -> list[str]:
        """What keeps kernels on this target from serving `scheme` (with its quantized activations) for qweight."""
        reasons = kernel_reasons(qweight.n, qweight.k, scheme, self.compute_config, self.target, has_bias=has_bias,
                                 dtype=_DTYPE_NAME[self.dtype], out_dtype=_OUT_NAME[out_dtype])
        if qweight.k_perm is not None:
            reasons.append("act-order weights (k_perm) with quantized activations: the codes would need a gather")
        return reasons

    @property
    def fold_scales(self) -> bool:
        """The e8m0 group scales fold into the e4m3 weight operand of the warp-specialized kernels (their names
        end in `_fold`); False: every kernel promotes partial sums with the group scales."""
        return self.layer_config.fold_scales

    # --- constructors ------------------------------------------------------------------------
    @classmethod
    def from_float(cls, weight: torch.Tensor, scheme: "QuantScheme | str", bias: torch.Tensor | None = None,
                   dtype: torch.dtype = torch.bfloat16, **kwargs) -> "QuantLinear":
        """Quantize a float (N, K) weight with `scheme` (a QuantScheme or preset name) and build the layer."""
        if isinstance(scheme, str):
            from humming_gen.schemes.presets import preset

            scheme = preset(scheme)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(f"weight must be a float (N, K) tensor, got "
                             f"{getattr(weight, 'shape', type(weight).__name__)}")
        return cls(scheme.quantize(weight.detach()), bias, dtype, **kwargs)

    @classmethod
    def from_quantized(cls, qweight: QuantizedWeight, bias: torch.Tensor | None = None,
                       dtype: torch.dtype = torch.bfloat16, **kwargs) -> "QuantLinear":
        """Build from a QuantizedWeight (QuantScheme.quantize, humming_gen.convert or load_layer)."""
        return cls(qweight, bias, dtype, **kwargs)

    # --- run -------------------------------------------------------------------------------------
    def kernel_for(self, m: int):
        for m_max, kernel in self._buckets:
            if m_max is None or m <= m_max:
                return kernel
        raise AssertionError("the last bucket is open-ended")

    @property
    def kernels(self) -> list:
        return list(self._kernels.values())

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError / TypeError naming what is wrong with an activation (metadata only: fake tensors pass too)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise ValueError(f"x has dtype {x.dtype}; this layer was built for {self.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected (..., {self.in_features})")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device}; the layer's weights are on {self.device}")

    def check_out(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """ValueError / TypeError naming what is wrong with a caller's output tensor for input `x`."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != self.out_dtype:
            raise ValueError(f"out has dtype {out.dtype}; this layer writes {self.out_dtype} (its out_dtype)")
        expected = (*x.shape[:-1], self.out_features)
        if tuple(out.shape) != expected:
            raise ValueError(f"out has shape {tuple(out.shape)}; expected {expected} for x of shape {tuple(x.shape)}")
        if out.device != self.device:
            raise ValueError(f"out is on {out.device}; the layer's weights are on {self.device}")

    def _out_rows(self, out: torch.Tensor) -> torch.Tensor:
        """`out` as an (m, N) matrix the kernel writes through its row stride ldc, or a ValueError saying why not:
        unit column stride, rows evenly spaced (any leading dims collapse into one row index), rows disjoint."""
        n = self.out_features
        c = _as_rows(out, n)
        if c is None:
            raise ValueError(f"out has strides {out.stride()} for shape {tuple(out.shape)}; the kernel writes a "
                             f"unit column stride (out.stride(-1) == 1) and rows evenly spaced (leading dimensions "
                             f"that collapse into one row index, as out.view(-1, {n}) does)")
        if c.shape[0] == 0:
            return c
        if c.shape[0] == 1:  # one row: its row stride is never used (kept in range for the kernel's 32-bit ldc)
            return c if c.stride(0) == n else c.as_strided((1, n), (n, 1))
        if not n <= c.stride(0) <= _INT32_MAX:
            raise ValueError(f"out has strides {out.stride()} for shape {tuple(out.shape)}; its rows must be "
                             f"disjoint and evenly spaced: a row stride in [{n}, {_INT32_MAX}] elements, got "
                             f"{c.stride(0)}")
        return c

    def _activation_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x as the (m, K) matrix the kernel reads, copied only where the kernel cannot read it in place: columns
        not unit-strided, rows not evenly spaced, a row stride that is not a multiple of 8 elements (16 bytes) or
        not 16-byte aligned, K % 8 != 0 (padded with zeros), an act-order permutation (a gather)."""
        k = self.in_features
        a = _as_rows(x, k)
        if a is None:
            a = x.reshape(-1, k).contiguous()  # a copy: no single row stride reaches every row
        if a.shape[0] == 1 and a.stride(0) != k:
            a = a.as_strided((1, k), (k, 1))  # one row: its row stride is never used
        if self.weight.k_perm is not None:
            a = a[:, self.weight.k_perm]
        if k % 8 or a.stride(0) % 8 or a.data_ptr() % 16 or a.stride(0) > _INT32_MAX:
            a = torch.nn.functional.pad(a, (0, (-k) % 8)).contiguous()
        return a

    def launch(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """out = x @ W^T (+ bias) for checked `x` (..., K) and `out` (..., N) (`check_input`, `check_out`)."""
        c = self._out_rows(out)
        m = c.shape[0]
        if m == 0:
            return
        if self.activation_scheme is not None:
            self._launch_quantized(x, c)
            return
        if self.value_scheme is not None:  # the 16-bit kernels on the scheme's quantized values (groups along x's K)
            x = self._quantized_values(x)
        a = self._activation_rows(x)
        for m_max, launcher in self._launchers:
            if m_max is None or m <= m_max:
                launcher(a, c)
                return

    def _launch_quantized(self, x: torch.Tensor, c: torch.Tensor) -> None:
        """Quantize x's rows on the GPU (humming_gen.quantize_activation, into the layout the bucket's kernel reads:
        rows of 16-byte stride, or the panels its stages bulk-copy; it triggers PDL, so the GEMM's weight prefetch
        overlaps it) and run the GEMM on the codes; or, for the buckets whose kernel quantizes in its loader
        (quantize_in_gemm=True), run that kernel on x."""
        m = c.shape[0]
        for (m_max, launcher), fused, layout in zip(self._launchers, self.quantizes_in_gemm, self._code_layouts):
            if m_max is None or m <= m_max:
                break
        if fused:  # the GEMM reads x (16-byte aligned rows) and quantizes it in its loader
            launcher(self._activation_rows(x), c, self._static_scale)  # (a static per-tensor scale)
            return
        a = self._quantize_rows(x)
        quantizer = self._row_quantizers.get(layout, False)
        if quantizer is False:  # first quantized call: bind the launch where one kernel serves the scheme
            from humming_gen.activation.api import RowQuantizer

            quantizer = self._row_quantizers[layout] = RowQuantizer.create(
                self.activation_scheme, a.dtype, self.in_features, a.device, self._static_scale,
                panels=layout == "panels")
        if (quantizer is not None and a.stride(0) * a.element_size() % 16 == 0 and a.data_ptr() % 16 == 0
                and m <= MAX_PANEL_ROWS):  # (quantize_activation refuses more rows for panels, naming the limit)
            _buf, codes, scales = quantizer(a)  # (_buf holds codes and scales until the GEMM is launched)
            launcher.launch_codes(codes, quantizer.lda(m), m, c, scales)
            return
        from humming_gen.activation import quantize_activation

        qa = quantize_activation(a, self.activation_scheme, static_scale=self._static_scale, layout=layout)
        launcher(qa.codes, c, qa.scales)

    def _quantize_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x's (m, K) rows as the quantization kernels read them: in place where one row stride reaches them all (one
        row: its stride, never used, set to K, as quantize_activation's view sets it)."""
        k = self.in_features
        a = _as_rows(x, k)
        if a is None:
            return x.reshape(-1, k).contiguous()
        return a.as_strided((1, k), (k, 1)) if a.shape[0] == 1 and a.stride(0) != k else a

    def _quantized_values(self, x: torch.Tensor) -> torch.Tensor:
        """The value route's (m, K) activations: x quantized with value_scheme and dequantized to the layer's dtype,
        by the quantize launch bound on the first call where the rows allow (else fake_quantize_activation)."""
        a = self._quantize_rows(x)
        quantizer = self._row_quantizers.get("values", False)
        if quantizer is False:  # first call: bind the launch where one kernel serves the scheme
            from humming_gen.activation.api import RowQuantizer

            quantizer = self._row_quantizers["values"] = RowQuantizer.create(
                self.value_scheme, a.dtype, self.in_features, a.device, self._static_scale,
                dequantize=_DTYPE_NAME[self.dtype])
        if quantizer is not None and a.stride(0) * a.element_size() % 16 == 0 and a.data_ptr() % 16 == 0:
            values, _scales = quantizer.tensors(a)  # (the scales are not read: freed after the launch, in order)
            return values.view(self.dtype)
        from humming_gen.activation import fake_quantize_activation

        return fake_quantize_activation(a, self.value_scheme, self._static_scale, dtype=self.dtype)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """y = x @ W^T (+ bias) through the `humming_gen::gemm` op (or `gemm_out` into `out`, returned).

        x: (..., K) of the layer's dtype. Rows may be strided (a slice of a larger buffer): read in place where
        the kernel can (`_activation_rows` says when it copies).
        out: optional (..., N) tensor of the layer's out_dtype with a unit column stride and evenly spaced rows.
        """
        # Types first: the op's schema would refuse other values with a less helpful message.
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if out is None:
            if direct_call(x):  # plain eager call: the op's body without its dispatch (humming_gen.layer.eager)
                return run_gemm(self, x)
            return torch.ops.humming_gen.gemm(x, self._op_id)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if direct_call(x, out):
            run_gemm_out(self, x, out)
        else:
            torch.ops.humming_gen.gemm_out(x, out, self._op_id)
        return out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme=({self.scheme.summary()}), "
                f"dtype={self.dtype}, target={self.target.name}, kernels={len(self._kernels)}"
                + (", fold_scales=True" if self.fold_scales else "")
                + (", dequantize_activations=True" if self.value_scheme is not None else ""))
