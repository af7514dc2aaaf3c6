"""When a forward call may skip the torch.library op and run the op's eager body directly.

A custom op call costs several microseconds of dispatch (autograd, dynamo-disable wrapper, alias checks) on top
of the body, the same body an op call would run. Tracing needs the op: torch.compile (dynamo folds
`is_compiling()` to True, so nothing after it is traced), make_fx / export and FakeTensorMode (a dispatch or
torch-function mode is active, or the tensors are subclasses), torch.func transforms (vmap, grad), autograd (a
tensor requires grad: the op raises its own error). Everywhere else the direct call is the same computation with
the same launches.

On by default (run on the H200 under the GPU tests of ops, QuantLinear and QuantMoE, and CPU-verified to launch the
same packed parameters as the op path): HUMMING_GEN_DIRECT_EAGER=0 sends every call through the op. `ENABLED` is
read at import; tests set it directly.
"""

from __future__ import annotations

import os

import torch

ENABLED = os.environ.get("HUMMING_GEN_DIRECT_EAGER", "1") != "0"

_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_transforms = torch._C._are_functorch_transforms_active


def direct_call(*tensors: "torch.Tensor | None") -> bool:
    """True where plain eager execution on plain tensors lets a caller run an op's body without the op (and the
    direct path is enabled)."""
    if not ENABLED or torch.compiler.is_compiling() or _dispatch_modes() or _function_modes() or _transforms():
        return False
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or t.requires_grad):
            return False
    return True
