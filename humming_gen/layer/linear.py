"""QuantLinear: a torch module running a quantized dense layer through generated kernels, one per M bucket."""

from __future__ import annotations

import torch

from humming_gen.config import ComputeConfig, LayerConfig
from humming_gen.heuristics import TuningPlan, choose_tunings
from humming_gen.layer.weights import PreparedWeight, layout_key, prepare_weight
from humming_gen.schemes import QuantizedWeight, QuantScheme
from humming_gen.targets import Target

_DTYPE_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_OUT_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


class QuantLinear(torch.nn.Module):
    """y = x @ W^T (+ bias) with W quantized. Build with `from_float` or `from_quantized`.

    All kernels (one per M bucket of the heuristics) are compiled in parallel at construction and share one
    packed copy of the weight; `forward` picks the kernel for the batch's row count. weight_only=True runs a
    scheme that also quantizes activations (FP8, W4A8, NVFP4 checkpoints) with 16-bit activations instead.
    """

    def __init__(self, qweight: QuantizedWeight, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16, *, target: "Target | str | None" = None,
                 device: "torch.device | str | None" = None, tunings: TuningPlan | None = None,
                 out_dtype: torch.dtype | None = None, compiler: str | None = None, weight_only: bool = False):
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
        if qweight.scheme.activation is not None:
            if not weight_only:
                raise ValueError(
                    f"the scheme quantizes activations ({qweight.scheme.activation.dtype.name}, "
                    f"{qweight.scheme.activation.granularity}); kernels with quantized activations are not generated "
                    f"yet. Pass weight_only=True to run the weights with {_DTYPE_NAME[dtype]} activations")
            import attrs

            qweight = attrs.evolve(qweight, scheme=attrs.evolve(qweight.scheme, activation=None))
        out_dtype = out_dtype or dtype
        if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
        self.in_features, self.out_features = qweight.k, qweight.n
        self.dtype = dtype
        self.out_dtype = out_dtype
        self.scheme: QuantScheme = qweight.scheme
        self.layer_config = LayerConfig(n=qweight.n, k=qweight.k, scheme=qweight.scheme, has_bias=bias is not None,
                                        dtype=_DTYPE_NAME[dtype], out_dtype=_OUT_NAME[out_dtype])
        self.target = _resolve_target(target)
        self.compute_config = ComputeConfig()
        self.tunings = tunings or choose_tunings(self.layer_config, self.target)
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
        self.device = torch.device(device)
        self.weight: PreparedWeight = prepare_weight(next(iter(plans.values())), qweight, self.device)
        self.bias = None
        if bias is not None:
            if bias.shape != (qweight.n,):
                raise ValueError(f"bias must have shape ({qweight.n},), got {tuple(bias.shape)}")
            self.bias = bias.detach().to(self.device, dtype).contiguous()
        # One launcher per bucket, with weights, scales, bias and split-K scratch bound once.
        self._launchers = [(m_max, kernel.bind(self.weight, self.bias, self.device, m_max))
                           for m_max, kernel in self._buckets]

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

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise ValueError(f"x has dtype {x.dtype}; this layer was built for {self.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected (..., {self.in_features})")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device}; the layer's weights are on {self.device}")
        if not x.is_contiguous():
            raise ValueError(f"x must be contiguous (strides {x.stride()} for shape {tuple(x.shape)}); "
                             f"call .contiguous() first")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        a = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        m = a.shape[0]
        out = torch.empty(m, self.out_features, dtype=self.out_dtype, device=self.device)
        if m:
            if self.weight.k_perm is not None:
                a = a[:, self.weight.k_perm]
            if self.in_features % 8 or a.data_ptr() % 16:
                a = torch.nn.functional.pad(a, (0, (-self.in_features) % 8)).contiguous()
            for m_max, launcher in self._launchers:
                if m_max is None or m <= m_max:
                    launcher(a, out)
                    break
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme=({self.scheme.summary()}), "
                f"dtype={self.dtype}, target={self.target.name}, kernels={len(self._kernels)}")
