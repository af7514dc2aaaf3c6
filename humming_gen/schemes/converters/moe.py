"""MoE checkpoints -> the two stacked expert weights of a QuantMoE (`convert_moe`, `load_moe`).

A prefix names a model's experts module; the layout under it is detected from the tensor names:

| layout | names under `prefix` | w13 rows | activation |
|---|---|---|---|
| gpt-oss (transformers) | `gate_up_proj_blocks/_scales/_bias`, `down_proj_blocks/_scales/_bias` (E stacked) | interleaved g0, u0, g1, ... | swiglu_oai |
| gpt-oss (OpenAI original) | `mlp1_weight.blocks/.scales`, `mlp1_bias`, `mlp2_weight.*`, `mlp2_bias` | interleaved | swiglu_oai |
| per-expert modules | `{e}.gate_proj/up_proj/down_proj.*` (DeepSeek, Qwen) or `{e}.w1/w3/w2.*` (Mixtral) | split [gate; up] | silu_mul |

Per-expert modules go through the checkpoint's own converter (compressed-tensors, fp8, GPTQ, AWQ, ...) and are
stacked (`*` prefixes) and fused gate + up along N without re-quantizing (converters/dispatch.py). gpt-oss keeps
its interleaved rows and biases as stored: QuantMoE reads that layout directly (gate_up_layout="interleaved").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import torch

from humming_gen.schemes.scheme import QuantizedWeight

if TYPE_CHECKING:
    from humming_gen.layer.moe import QuantMoE

_PER_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))  # (gate, up, down)


class MoeWeights(NamedTuple):
    """One MoE layer's experts in the standard form, as the checkpoint defines them.

    q13 (E, 2I, H) gate/up rows in `gate_up_layout`; q2 (E, H, I); bias13 (E, 2I) / bias2 (E, H) or None, in the
    checkpoint's dtype; activation: the format's model family's gated activation (override it if your model
    differs)."""

    q13: QuantizedWeight
    q2: QuantizedWeight
    bias13: torch.Tensor | None
    bias2: torch.Tensor | None
    gate_up_layout: str
    activation: str

    def weight_only(self) -> "MoeWeights":
        """The same weights with activation quantization dropped (16-bit activations): what `to_layer` builds. A
        DeepSeek FP8 block checkpoint (fp8 activations per 128-group) then runs W8A16; QuantMoE.from_quantized(q13,
        q2) of the weights as converted runs them W8A8."""
        def drop(q: QuantizedWeight) -> QuantizedWeight:
            if q.scheme.activation is None and q.input_scale is None:
                return q
            return attrs.evolve(q, scheme=attrs.evolve(q.scheme, activation=None), input_scale=None)

        return self._replace(q13=drop(self.q13), q2=drop(self.q2))

    def to_layer(self, **kwargs: Any) -> "QuantMoE":
        """A QuantMoE of these weights (weight-only, see `weight_only`); kwargs go to QuantMoE (dtype, target,
        device, activation to override the format's)."""
        from humming_gen.layer.moe import QuantMoE

        w = self.weight_only()
        kwargs.setdefault("activation", w.activation)
        return QuantMoE.from_quantized(w.q13, w.q2, gate_up_layout=w.gate_up_layout, bias13=w.bias13,
                                       bias2=w.bias2, **kwargs)


def _join(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def convert_moe(tensors: Mapping[str, torch.Tensor], quantization_config: Mapping[str, Any], prefix: str,
                format: str | None = None) -> MoeWeights:
    """The experts under `prefix` (e.g. `model.layers.0.mlp.experts`) -> MoeWeights (layouts: module docstring).

    tensors: checkpoint names -> tensors (a lazy mapping works). quantization_config / format: as for
    humming_gen.convert. Raises ValueError naming the prefix and the names looked for when no layout matches, and
    the converters' errors for missing or malformed tensors."""
    from humming_gen.schemes.converters.dispatch import convert

    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str naming the experts module, got {type(prefix).__name__}")
    cfg = dict(quantization_config)
    prefix = prefix.rstrip(".")
    for up, down, bias13, bias2 in (("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"),
                                    ("mlp1_weight", "mlp2_weight", "mlp1_bias", "mlp2_bias")):
        head = _join(prefix, up)
        if f"{head}_blocks" in tensors or f"{head}.blocks" in tensors:
            q13 = convert(tensors, cfg, head, format=format)
            q2 = convert(tensors, cfg, _join(prefix, down), format=format)
            b13, b2 = (tensors[n] if n in tensors else None for n in (_join(prefix, bias13), _join(prefix, bias2)))
            return MoeWeights(q13, q2, b13, b2, "interleaved", "swiglu_oai")
    for gate, up, down in _PER_EXPERT_NAMES:
        first = _join(prefix, f"0.{gate}.")
        if any(name.startswith(first) for name in tensors):
            parts = [_join(prefix, f"*.{gate}"), _join(prefix, f"*.{up}")]
            q13 = convert(tensors, cfg, parts, format=format)
            q2 = convert(tensors, cfg, _join(prefix, f"*.{down}"), format=format)
            b13 = _stacked_bias(tensors, prefix, (gate, up), q13.num_experts)
            b2 = _stacked_bias(tensors, prefix, (down,), q2.num_experts)
            if q13.num_experts != q2.num_experts:
                raise ValueError(f"experts under {prefix!r}: {q13.num_experts} gate/up but {q2.num_experts} down")
            return MoeWeights(q13, q2, b13, b2, "split", "silu_mul")
    looked = [f"{_join(prefix, 'gate_up_proj')}_blocks", f"{_join(prefix, 'mlp1_weight')}.blocks"] + \
        [f"{_join(prefix, f'0.{g}')}.*" for g, _, _ in _PER_EXPERT_NAMES]
    raise ValueError(f"no MoE experts under prefix {prefix!r}: looked for {looked} (prefix names the experts "
                     f"module, e.g. 'model.layers.0.mlp.experts')")


def _stacked_bias(tensors: Mapping[str, torch.Tensor], prefix: str, modules: tuple[str, ...],
                  num_experts: int) -> torch.Tensor | None:
    """Per-expert `.bias` of `modules` (concatenated along N), stacked to (E, N); None when expert 0 has none."""
    if _join(prefix, f"0.{modules[0]}.bias") not in tensors:
        return None
    rows = []
    for e in range(num_experts):
        names = [_join(prefix, f"{e}.{m}.bias") for m in modules]
        missing = [n for n in names if n not in tensors]
        if missing:
            raise ValueError(f"checkpoint tensors {missing} are missing (expert 0 has biases)")
        rows.append(torch.cat([tensors[n] for n in names]))
    return torch.stack(rows)


def load_moe(checkpoint_dir: str | Path, prefix: str, format: str | None = None,
             quantization_config: Mapping[str, Any] | None = None) -> MoeWeights:
    """Read one MoE layer's experts from a safetensors checkpoint directory (only their tensors are read).

    prefix: the experts module (`model.layers.0.mlp.experts`; `block.0.mlp` for OpenAI's gpt-oss files).
    Returns MoeWeights, CPU tensors as stored; `.to_layer(dtype=..., device=...)` builds the QuantMoE (weight-only,
    so e.g. DeepSeek FP8 block experts run W8A16; `QuantMoE.from_quantized(w.q13, w.q2, ...)` keeps their fp8
    activations)."""
    from humming_gen.schemes.checkpoint import SafetensorsCheckpoint, _safetensors, read_quantization_config

    _safetensors()
    cfg = quantization_config if quantization_config is not None else read_quantization_config(checkpoint_dir)
    return convert_moe(SafetensorsCheckpoint(checkpoint_dir), cfg, prefix, format=format)
