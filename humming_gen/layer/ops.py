"""The torch.library custom ops of the dense path: `humming_gen::gemm` and `humming_gen::gemm_out`.

`QuantLinear.forward` goes through them, so torch.compile sees one opaque call per layer (no graph break) whose
fake implementation gives the output's shape and dtype for any, also symbolic, row count.

Why the op takes a layer id and not the weight tensors: a layer's kernels and launchers (weight pointers and
split-K scratch bound once, per M bucket) are Python objects no op schema can carry, and which prepared tensors
exist depends on the scheme. So the schema is tensors plus one int that names the layer in a process-wide
registry of weak references (a dropped layer is freed; its id then raises). Dynamo treats the int as a constant
attribute of the module; the fake implementation needs only the layer's in/out features, dtypes and device.
The registry is per process: a compiled graph holding an id is not portable to another process (export).
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from humming_gen.layer.linear import QuantLinear

_LAYERS: dict[int, weakref.ref] = {}
_IDS = itertools.count(1)


def register_layer(layer: "QuantLinear") -> int:
    """A new id for `layer` (held weakly; the entry goes when the layer is collected)."""
    layer_id = next(_IDS)
    _LAYERS[layer_id] = weakref.ref(layer, lambda _ref, i=layer_id: _LAYERS.pop(i, None))
    return layer_id


def get_layer(layer_id: int) -> "QuantLinear":
    ref = _LAYERS.get(layer_id)
    layer = ref() if ref is not None else None
    if layer is None:
        raise ValueError(f"humming_gen::gemm: layer_id {layer_id} names no live QuantLinear in this process "
                         f"(ids come from QuantLinear construction and end with the layer)")
    return layer


def run_gemm(layer: "QuantLinear", x: torch.Tensor) -> torch.Tensor:
    """The eager body of `humming_gen::gemm` (QuantLinear.forward calls it without the op where that is the same:
    humming_gen.layer.eager)."""
    layer.check_input(x)
    out = torch.empty(*x.shape[:-1], layer.out_features, dtype=layer.out_dtype, device=x.device)
    layer.launch(x, out)
    return out


def run_gemm_out(layer: "QuantLinear", x: torch.Tensor, out: torch.Tensor) -> None:
    """The eager body of `humming_gen::gemm_out`."""
    layer.check_input(x)
    layer.check_out(x, out)
    layer.launch(x, out)


@torch.library.custom_op("humming_gen::gemm", mutates_args=())
def gemm(x: torch.Tensor, layer_id: int) -> torch.Tensor:
    """y = x @ W^T (+ bias) of layer `layer_id`; x (..., K), rows may be strided, y (..., N) contiguous."""
    return run_gemm(get_layer(layer_id), x)


@gemm.register_fake
def _gemm_fake(x: torch.Tensor, layer_id: int) -> torch.Tensor:
    layer = get_layer(layer_id)
    layer.check_input(x)
    return x.new_empty(*x.shape[:-1], layer.out_features, dtype=layer.out_dtype)


@torch.library.custom_op("humming_gen::gemm_out", mutates_args=("out",))
def gemm_out(x: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    """out = x @ W^T (+ bias) of layer `layer_id`, written into a caller's tensor (rows may be strided)."""
    run_gemm_out(get_layer(layer_id), x, out)


@gemm_out.register_fake
def _gemm_out_fake(x: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    layer = get_layer(layer_id)
    layer.check_input(x)
    layer.check_out(x, out)
