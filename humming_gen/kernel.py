"""`humming_gen.compile`: configs -> a compiled `Kernel` (source, cubin, launch facts) and its launch path."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import torch

from humming_gen.codegen import KernelPlan, compose, render
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.runtime import CompiledKernel, compile_cached, compile_many
from humming_gen.runtime.compile import resolve_compiler
from humming_gen.targets import Target, get_target

_STRUCT_CODE = {"const void*": "Q", "void*": "Q", "int": "i"}


def plan_key(layer: LayerConfig, compute: ComputeConfig, tuning: TuningConfig, target: Target) -> str:
    """Stable 12-hex-digit key of the configs and target (shown in the source header)."""
    text = "|".join([layer.key(), compute.key(), tuning.key(), target.name])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _resolve_target(target: "Target | str | None") -> Target:
    if target is None:
        return Target.current()
    if isinstance(target, str):
        return get_target(target)
    if not isinstance(target, Target):
        raise TypeError(f"target must be a Target, an arch string such as 'sm_90a', or None; got {target!r}")
    return target


class Kernel:
    """A generated, compiled kernel: `source` is the complete .cu, `compiled` the cubin and ptxas report.

    Loading onto the GPU happens on first launch, so a Kernel for any target can be built without a GPU.
    """

    def __init__(self, plan: KernelPlan, source: str, compiled: CompiledKernel | None):
        self.plan = plan
        self.source = source
        self.compiled = compiled
        self.name = plan.kernel_name
        self._loaded: dict[int, Any] = {}
        self._scratch: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        fields = plan.param_fields
        self._pointer_fields = [f[0] for f in fields if f[1] != "int"]
        fmt = "<" + "".join(_STRUCT_CODE[f[1]] for f in fields)
        size = struct.calcsize(fmt)
        self._struct = struct.Struct(fmt + "x" * ((-size) % 8))

    def __repr__(self) -> str:
        return f"Kernel({self.name}, target={self.plan.target.name}, smem={self.plan.shared_bytes} B)"

    @property
    def resources(self) -> dict:
        """ptxas figures (registers, spills, ...) of the entry function."""
        if self.compiled is None:
            return {}
        res = self.compiled.resources
        return res.get(self.name, res) if isinstance(res, dict) else {}

    def save(self, path: str) -> str:
        with open(path, "w") as f:
            f.write(self.source)
        return path

    # --- launch ------------------------------------------------------------------------------
    def _function(self, device: int):
        fn = self._loaded.get(device)
        if fn is None:
            from humming_gen.runtime import load

            if self.compiled is None:
                raise RuntimeError(f"kernel {self.name} was generated without compiling (compile=False)")
            fn = load(self.compiled, self.plan.shared_bytes)
            self._loaded[device] = fn
        return fn

    def _split_k_scratch(self, m: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Workspace and arrival counters, sized for the largest M seen; counters start (and stay) zero."""
        floats, counters = self.plan.workspace_floats(m), self.plan.counter_count(m)
        key = (device.index or 0, 0)
        have = self._scratch.get(key)
        if have is None or have[0].numel() < floats or have[1].numel() < counters:
            have = (torch.empty(max(floats, 1), dtype=torch.float32, device=device),
                    torch.zeros(max(counters, 1), dtype=torch.int32, device=device))
            self._scratch[key] = have
        return have

    def launch(self, x: torch.Tensor, weight, out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """out[:m] = x @ W^T (+ bias). x (m, k) and out (m, n) must be row-major with unit column stride;
        `weight` is the PreparedWeight of this kernel's layout. No checks beyond what the caller did."""
        from humming_gen.runtime import launch

        plan = self.plan
        m = x.shape[0]
        ptrs = {"a": x.data_ptr(), "b": weight.b.data_ptr(), "c": out.data_ptr()}
        if weight.b_scale is not None:
            ptrs["b_scale"] = weight.b_scale.data_ptr()
        if weight.b_zero is not None:
            ptrs["b_zero"] = weight.b_zero.data_ptr()
        if weight.out_scale is not None:
            ptrs["out_scale"] = weight.out_scale.data_ptr()
        if bias is not None:
            ptrs["bias"] = bias.data_ptr()
        if plan.tuning.split_k > 1:
            ws, cnt = self._split_k_scratch(m, x.device)
            ptrs["workspace"], ptrs["counters"] = ws.data_ptr(), cnt.data_ptr()
        values = [ptrs[name] for name in self._pointer_fields] + [m, x.stride(0), out.stride(0)]
        params = self._struct.pack(*values)
        fn = self._function(x.device.index or 0)
        launch(fn, plan.grid(m), (plan.threads, 1, 1), plan.shared_bytes, params, pdl=plan.pdl)
        return out


def generate(plan: KernelPlan, compiler: str | None = None) -> str:
    """The kernel source of a plan (deterministic: same configs, same text)."""
    from humming_gen.runtime import compiler_version
    from humming_gen.runtime.compile import resolve_options

    name = resolve_compiler(compiler)
    try:
        version = compiler_version(name)
        options = " ".join(resolve_options(plan.target.arch, name))
    except Exception:  # no such compiler or arch here (zhenwu810e): the source is still generated
        version, options = name, "(not compiled here)"
    return render(plan, key=plan_key(plan.layer, plan.compute, plan.tuning, plan.target), compiler=version,
                  options=options)


def build(plan: KernelPlan, *, compiler: str | None = None, compile: bool = True) -> Kernel:
    source = generate(plan, compiler)
    compiled = (compile_cached(source, plan.kernel_name, plan.target.arch, compiler=resolve_compiler(compiler))
                if compile else None)
    return Kernel(plan, source, compiled)


def build_many(plans: list[KernelPlan], *, compiler: str | None = None) -> list[Kernel]:
    """Generate and compile several kernels in parallel (a progress bar appears past one second)."""
    sources = [generate(p, compiler) for p in plans]
    if not plans:
        return []
    if plans[0].target.arch is None:
        return [Kernel(p, s, None) for p, s in zip(plans, sources)]
    compiled = compile_many([(s, p.kernel_name, p.target.arch) for s, p in zip(sources, plans)],
                            compiler=resolve_compiler(compiler))
    return [Kernel(p, s, c) for p, s, c in zip(plans, sources, compiled)]


def compile(layer_config: LayerConfig, compute_config: ComputeConfig | None = None,
            tuning_config: TuningConfig | None = None, target: "Target | str | None" = None, *,
            m: int = 1, compiler: str | None = None) -> Kernel:
    """Generate and compile one kernel.

    Defaults: ComputeConfig() and the heuristic TuningConfig for `m` rows on `target` (the current GPU when
    None, or an arch string such as "sm_90a" with no GPU present). Raises ComposeError naming every reason
    the configs cannot be served, CompileError with the compiler log.
    """
    tgt = _resolve_target(target)
    compute = compute_config or ComputeConfig()
    if tuning_config is None:
        from humming_gen.heuristics import choose_tunings

        tuning_config = choose_tunings(layer_config, tgt).for_m(m)
    plan = compose(layer_config, compute, tuning_config, tgt)
    return build(plan, compiler=compiler)
