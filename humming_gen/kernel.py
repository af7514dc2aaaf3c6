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
LAUNCH_CACHE_SIZE = 4  # launchers Kernel.launch keeps (oldest dropped first); QuantLinear binds its own


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
        self._launchers: dict[tuple, Launcher] = {}
        fields = plan.param_fields
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

    def bind(self, weight, bias: torch.Tensor | None, device: torch.device, max_m: int | None = None) -> "Launcher":
        """A launcher with every argument that does not change between calls resolved once (weights, scales,
        bias, split-K scratch sized for `max_m` rows), so a call only packs a, c and m."""
        return Launcher(self, weight, bias, device, max_m)

    def launch(self, x: torch.Tensor, weight, out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """out[:m] = x @ W^T (+ bias). x (m, k) and out (m, n) must be row-major with unit column stride;
        `weight` is the PreparedWeight of this kernel's layout. No checks beyond what the caller did.

        The launcher (and its split-K scratch) of the last LAUNCH_CACHE_SIZE weights is kept; for CUDA graphs
        over more weights, hold your own from `bind` (QuantLinear does), so no captured scratch is ever freed."""
        key = (id(weight), id(bias), x.device)
        launcher = self._launchers.get(key)
        if launcher is None or launcher.weight is not weight or launcher.bias is not bias:
            if key not in self._launchers and len(self._launchers) >= LAUNCH_CACHE_SIZE:
                del self._launchers[next(iter(self._launchers))]  # a launcher holds its weight: keep a few alive
            launcher = self._launchers[key] = self.bind(weight, bias, x.device)
        launcher(x, out)
        return out


class Launcher:
    """The launch path of one (kernel, weight) pair. Host overhead per call is part of performance: the
    params list is prebuilt, a call fills in the activation and output pointers, m and the row strides."""

    __slots__ = ("kernel", "weight", "bias", "device", "_values", "_a", "_c", "_struct", "_fn", "_grid_n", "_block_m",
                 "_split_k", "_block", "_smem", "_pdl", "_scratch_rows", "_ws_index", "_cnt_index", "_scratch")

    def __init__(self, kernel: Kernel, weight, bias: torch.Tensor | None, device: torch.device, max_m: int | None):
        plan = kernel.plan
        self.kernel, self.weight, self.bias, self.device = kernel, weight, bias, torch.device(device)
        static = {"b": weight.b, "b_scale": weight.b_scale, "b_zero": weight.b_zero, "out_scale": weight.out_scale,
                  "bias": bias}
        names = [f[0] for f in plan.param_fields if f[1] != "int"]  # the ints (m, lda, ldc) follow per call
        self._values = [static[n].data_ptr() if static.get(n) is not None else 0 for n in names]
        for n in names:
            if n in static and static[n] is None:
                raise ValueError(f"kernel {kernel.name} reads `{n}`, which the prepared weight / bias lacks")
        self._a, self._c = names.index("a"), names.index("c")
        self._ws_index = names.index("workspace") if "workspace" in names else -1
        self._cnt_index = names.index("counters") if "counters" in names else -1
        self._struct = kernel._struct
        self._fn = None
        self._grid_n, self._block_m, self._split_k = plan.n_pad // plan.tuning.block_n, plan.tuning.block_m, \
            plan.tuning.split_k
        self._block, self._smem, self._pdl = (plan.threads, 1, 1), plan.shared_bytes, plan.pdl
        self._scratch_rows = 0
        self._scratch = None
        if self._ws_index >= 0:
            self._grow_scratch(max_m or plan.tuning.block_m)

    def _grow_scratch(self, m: int) -> None:
        """Split-K workspace and arrival counters (zeroed once; the kernel leaves them zero) for m rows.
        NOTE: bound to a bucket's largest M at construction, so CUDA graphs never see it move."""
        plan = self.kernel.plan
        ws = torch.empty(max(plan.workspace_floats(m), 1), dtype=torch.float32, device=self.device)
        cnt = torch.zeros(max(plan.counter_count(m), 1), dtype=torch.int32, device=self.device)
        self._scratch = (ws, cnt)
        self._values[self._ws_index], self._values[self._cnt_index] = ws.data_ptr(), cnt.data_ptr()
        self._scratch_rows = -(-m // plan.tuning.block_m) * plan.tuning.block_m

    def __call__(self, a: torch.Tensor, out: torch.Tensor) -> None:
        from humming_gen.runtime import launch

        m = a.shape[0]
        if self._fn is None:
            self._fn = self.kernel._function(self.device.index or 0)
        if self._ws_index >= 0 and m > self._scratch_rows:
            self._grow_scratch(m)
        values = self._values
        values[self._a], values[self._c] = a.data_ptr(), out.data_ptr()
        params = self._struct.pack(*values, m, a.stride(0), out.stride(0))
        launch(self._fn, (self._grid_n, -(-m // self._block_m), self._split_k), self._block, self._smem, params,
               pdl=self._pdl)


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
    from humming_gen.config.limits import MAX_M
    from humming_gen.config.validate import check_int

    check_int("compile", "m", m, lo=1, hi=MAX_M, why="rows the kernel is tuned for; the kernel's m is a 32-bit int")
    tgt = _resolve_target(target)
    compute = compute_config or ComputeConfig()
    if tuning_config is None:
        from humming_gen.heuristics import choose_tunings

        tuning_config = choose_tunings(layer_config, tgt).for_m(m)
    plan = compose(layer_config, compute, tuning_config, tgt)
    return build(plan, compiler=compiler)
