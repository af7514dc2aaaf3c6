"""`humming_gen.compile`: configs -> a compiled `Kernel` (source, cubin, launch facts) and its launch path."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import attrs
import torch

from humming_gen.codegen import KernelPlan, compose, render
from humming_gen.pipelines.base import (ACTIVATION, ACTIVATION_MAP, ACTIVATION_SCALE, BIAS, CTYPES, LDA, LDC,
                                        OUT_TOP_K, OUTPUT,
                                        OUTPUT_SCALE,
                                        ROUTING, ROWS, SCRATCH, TOP_K, WEIGHT, KernelArg, PersistentLaunch)
from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig
from humming_gen.config.tuning import PANEL_LOADS
import humming_gen.runtime as runtime
from humming_gen.runtime import CompiledKernel, compile_cached, compile_many
from humming_gen.runtime.compile import resolve_compiler
from humming_gen.runtime.launch import max_active_clusters
from humming_gen.runtime.tensor_map import MAP_BYTES, ActivationMaps
from humming_gen.targets import Target, get_target

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
        fmt = "<" + "".join(CTYPES[a.ctype] for a in plan.args)
        size = struct.calcsize(fmt)
        # C pads Params to its alignment: 64 bytes with a TensorMap (its first field), else 8
        align = 64 if any(a.ctype == "TensorMap" for a in plan.args) else 8
        self._struct = struct.Struct(fmt + "x" * ((-size) % align))

    def __repr__(self) -> str:
        return f"Kernel({self.name}, target={self.plan.target.name}, smem={self.plan.shared_bytes} B)"

    @property
    def activation_layout(self) -> str:
        """How the kernel reads its activation codes: "panels" (TuningConfig.a_load='tma' or 'tma_multicast': quantize with
        quantize_activation(x, scheme, layout="panels")), else "rows"."""
        quantized = self.plan.layer.scheme.activation is not None  # (16-bit a_load='tma' reads rows by tensor map)
        return "panels" if quantized and self.plan.tuning.a_load in PANEL_LOADS else "rows"

    @property
    def a_scale_alignment(self) -> int:
        """Bytes the activation scales' address must be a multiple of: 4 where e8m0 scales are staged by 4-byte
        cp.asyncs (a token's groups of a stage), else their element size suffices."""
        return 4 if any(getattr(c, "e8m0", False) and "load_activation_scales_stage" in c.provides
                        for c in self.plan.components) else 1

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

    def launch(self, x: torch.Tensor, weight, out: torch.Tensor, bias: torch.Tensor | None = None,
               a_scale: torch.Tensor | None = None) -> torch.Tensor:
        """out[:m] = x @ W^T (+ bias). x (m, k) and out (m, n) must be row-major with unit column stride;
        `weight` is the PreparedWeight of this kernel's layout. No checks beyond what the caller did. Kernels with
        quantized activations take the codes as x and their fp32 scales as a_scale (humming_gen.quantize_activation,
        in the kernel's `activation_layout`: (K / 128, m, 128) codes for "panels").

        The launcher (and its split-K scratch) of the last LAUNCH_CACHE_SIZE weights is kept; for CUDA graphs
        over more weights, hold your own from `bind` (QuantLinear does), so no captured scratch is ever freed."""
        key = (id(weight), id(bias), x.device)
        launcher = self._launchers.get(key)
        if launcher is None or launcher.weight is not weight or launcher.bias is not bias:
            if key not in self._launchers and len(self._launchers) >= LAUNCH_CACHE_SIZE:
                del self._launchers[next(iter(self._launchers))]  # a launcher holds its weight: keep a few alive
            launcher = self._launchers[key] = self.bind(weight, bias, x.device)
        launcher(x, out, a_scale)
        return out


class Launcher:
    """The launch path of one (kernel, weight) pair. Host overhead per call is part of performance: every argument
    the kernel's spec (KernelPlan.args) marks as bound is resolved once here; a call fills in the activation and
    output pointers, m and the row strides (a_load='tma': and the activation's tensor map, encoded on the first call
    of each address, rows and row stride, which raises where TMA cannot address them). So a call checks only which
    arguments the kernel takes, not the tensors' dtypes, shapes, devices or alignment: QuantLinear, QuantMoE,
    moe_gemm and grouped_moe_gemm check them before they call a launcher; a caller of `QuantMoE.launcher_for` /
    `grouped_launcher` must pass what those functions would accept."""

    __slots__ = ("kernel", "weight", "bias", "device", "_values", "_per_call", "_struct", "_fn", "_grid", "_block",
                 "_smem", "_pdl", "_cluster", "_scratch_rows", "_scratch", "_scratch_slots", "_a_scale_slot",
                 "_a_scale_alignment", "_routing_slots", "_grids", "_panels", "_a_map_slot", "_a_maps")

    def __init__(self, kernel: Kernel, weight, bias: torch.Tensor | None, device: torch.device, max_m: int | None):
        plan = kernel.plan
        self.kernel, self.weight, self.bias, self.device = kernel, weight, bias, torch.device(device)
        self._values: list[int | bytes] = []
        self._per_call: dict[str, int] = {}  # kind -> index in _values
        self._scratch_slots: dict[str, int] = {}
        self._routing_slots: dict[str, int] = {}  # MoE: routing tensor -> index in _values
        for a in plan.args:
            self._values.append(self._bound_value(a))
            if a.kind in (ACTIVATION, OUTPUT, ROWS, LDA, LDC, ACTIVATION_SCALE, TOP_K, OUT_TOP_K, OUTPUT_SCALE,
                          ACTIVATION_MAP):
                self._per_call[a.kind] = len(self._values) - 1
            elif a.kind == ROUTING:
                self._routing_slots[a.tensor] = len(self._values) - 1
            elif a.kind == SCRATCH:
                self._scratch_slots[a.tensor] = len(self._values) - 1
        missing = {ACTIVATION, OUTPUT, ROWS, LDA, LDC} - set(self._per_call)
        if missing:
            raise ValueError(f"kernel {kernel.name}: its argument spec lacks {sorted(missing)}")
        self._a_scale_slot = self._per_call.get(ACTIVATION_SCALE)
        # a_load='tma': the activation's tensor map, encoded per (address, rows, row stride) and kept
        self._a_map_slot = self._per_call.get(ACTIVATION_MAP)
        self._a_maps = (ActivationMaps(plan.layer.dtype, plan.layer.k, plan.tuning.block_m)
                        if self._a_map_slot is not None else None)
        self._a_scale_alignment = kernel.a_scale_alignment
        self._panels = kernel.activation_layout == "panels"  # a: (K / 128, m, 128) codes, lda the panel stride
        self._struct = kernel._struct
        self._fn = None
        self._grid, self._block, self._smem, self._pdl = plan.grid, (plan.threads, 1, 1), plan.shared_bytes, plan.pdl
        if isinstance(plan.launch, PersistentLaunch) and self.device.type == "cuda":
            self._grid = self._resident_grid(plan.launch)
        self._cluster = plan.launch.cluster
        self._grids: dict[int, tuple[int, int, int]] = {}  # m -> grid (a plan's grid is a pure function of m)
        self._scratch_rows = 0
        self._scratch: dict[str, torch.Tensor] = {}
        if self._scratch_slots:
            self._grow_scratch(max_m or plan.tuning.block_m)

    def _resident_grid(self, launch: PersistentLaunch):
        """A persistent grid within this device's SMs: its split-K slices wait for each other, which needs every CTA
        resident (the target's SM count may be another part's: an sm_90a kernel on a 114- or 78-SM H100 / H20)."""
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        if launch.split_k > sms:
            raise ValueError(f"kernel {self.kernel.name}: split_k={launch.split_k} needs at least {launch.split_k} "
                             f"SMs resident at once; {self.device} has {sms}. Choose split_k <= {sms}")
        resident = attrs.evolve(launch, slots=min(launch.slots, sms))
        return resident.grid

    def _load(self) -> None:
        """Load the kernel onto this device; a persistent grid of clusters keeps to the clusters the device holds
        at once (fewer than SMs / cluster size where a GPC's SMs do not pair up)."""
        self._fn = self.kernel._function(self.device.index or 0)
        launch = self.kernel.plan.launch
        if self._cluster is not None and isinstance(launch, PersistentLaunch):
            size = self._cluster[0] * self._cluster[1] * self._cluster[2]
            clusters = max_active_clusters(self._fn, self._block, self._smem, self._cluster)
            if clusters < 1:
                raise RuntimeError(f"kernel {self.kernel.name}: {self.device} cannot hold one cluster of {size} CTAs "
                                   f"with {self._smem} B of shared memory each")
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            self._grid = attrs.evolve(launch, slots=min(launch.slots, sms, clusters * size)).grid
            self._grids.clear()

    def _bound_value(self, a: KernelArg) -> int | bytes:
        if a.ctype == "TensorMap":
            return bytes(MAP_BYTES)  # set per call
        if a.kind == WEIGHT:
            t = getattr(self.weight, a.tensor, None)
            if t is None:
                raise ValueError(f"kernel {self.kernel.name} reads `{a.name}`, which the prepared weight lacks")
            return t.data_ptr()
        if a.kind == BIAS:
            if self.bias is None:
                raise ValueError(f"kernel {self.kernel.name} reads `{a.name}`, but no bias was given")
            return self.bias.data_ptr()
        return 0

    def _grow_scratch(self, m: int) -> None:
        """Scratch buffers (split-K workspace, arrival counters zeroed once; the kernel leaves them zero) for m rows.
        NOTE: bound to a bucket's largest M at construction, so CUDA graphs never see it move."""
        plan = self.kernel.plan
        sizes = plan.scratch(m)
        for name, slot in self._scratch_slots.items():
            spec = sizes[name]
            dtype = torch.float32 if spec.dtype == "float32" else torch.int32
            make = torch.zeros if spec.zeroed else torch.empty
            t = make(max(spec.numel, 1), dtype=dtype, device=self.device)
            self._scratch[name] = t
            self._values[slot] = t.data_ptr()
        # the rows these buffers serve: a dense grid's whole last m tile; an MoE grid's worst-case m blocks grow
        # with every assignment (TiledLaunch.m_blocks), so exactly m
        moe = getattr(plan.launch, "moe_gemm", "")
        self._scratch_rows = m if moe else -(-m // plan.tuning.block_m) * plan.tuning.block_m

    def __call__(self, a: torch.Tensor, out: torch.Tensor, a_scale: torch.Tensor | None = None) -> None:
        """Launch on (m, k) activations `a` into `out`; `a_scale`: the fp32 scales of quantized activations
        (codes in `a`, row stride in bytes), which kernels with 8-bit activations need and others do not take.
        A kernel of activation_layout "panels" takes the codes as quantize_activation(layout="panels") returns them,
        (K / 128, m, 128)."""
        if self._routing_slots:
            raise ValueError(f"kernel {self.kernel.name} is an MoE kernel: launch it with Launcher.moe")
        self._set_a_scale(a_scale)
        if (a.dim() == 3) != self._panels or self._panels and (
                a.shape[0] * 128 != self.kernel.plan.layer.k or a.shape[2] != 128 or a.stride(2) != 1
                or a.stride(1) != 128):  # (3-D row codes of (B, S, K) activations are no panels)
            raise ValueError(f"kernel {self.kernel.name} reads activation codes in the "
                             f"{'panels' if self._panels else 'rows'} layout, got a of shape {tuple(a.shape)}; "
                             + ("quantize with quantize_activation(x, scheme, layout='panels')" if self._panels
                                else "pass (m, k) rows"))
        if self._panels:
            m = a.shape[1]
            if self._scratch_slots and m > self._scratch_rows:
                self._grow_scratch(m)
            self._launch_at(a.data_ptr(), a.stride(0), out, m)
            return
        m = a.shape[0]
        if self._scratch_slots and m > self._scratch_rows:
            self._grow_scratch(m)
        self._launch(a, out, m)

    def launch_codes(self, codes: int, ldq: int, m: int, out: torch.Tensor, a_scale: int) -> None:
        """Launch a dense kernel with 8-bit activations on m rows of codes at address `codes` (row stride `ldq`
        bytes, or the panel stride m * 128 for a kernel of activation_layout "panels") and their fp32 scales at
        `a_scale` (humming_gen.activation.RowQuantizer's buffer): the __call__ path without the tensors."""
        if self._a_scale_slot is None or self._routing_slots:
            raise ValueError(f"kernel {self.kernel.name}: launch_codes serves dense kernels with 8-bit activations")
        if self._scratch_slots and m > self._scratch_rows:
            self._grow_scratch(m)
        self._values[self._a_scale_slot] = a_scale
        self._launch_at(codes, ldq, out, m)

    def _set_a_scale(self, a_scale: torch.Tensor | None) -> None:
        """The activation scales of a kernel with quantized activations (ValueError where given to a 16-bit kernel
        or missing for an 8-bit one)."""
        if (a_scale is None) != (self._a_scale_slot is None):
            raise ValueError(f"kernel {self.kernel.name}: " + (
                "its activations are quantized; pass a_scale (the scales humming_gen.quantize_activation returns)"
                if a_scale is None else "a_scale given, but this kernel reads 16-bit activations without scales"))
        if a_scale is not None:
            ptr = a_scale.data_ptr()
            if ptr % self._a_scale_alignment:
                raise ValueError(f"kernel {self.kernel.name}: a_scale's address {ptr:#x} is not a multiple of "
                                 f"{self._a_scale_alignment} bytes (its e8m0 scales are copied in 4-byte words); pass "
                                 f"a tensor of its own (humming_gen.quantize_activation returns one)")
            self._values[self._a_scale_slot] = ptr

    def _launch(self, a: torch.Tensor, out: torch.Tensor, m: int) -> None:
        """Fill the per-call pointers, rows and strides (the other per-call fields are set) and launch."""
        self._launch_at(a.data_ptr(), a.stride(0), out, m)

    def _launch_at(self, a: int, lda: int, out: torch.Tensor, m: int) -> None:
        """_launch with the activation rows given by address and row stride."""
        if self._fn is None:
            self._load()
        grid = self._grids.get(m)
        if grid is None:
            if len(self._grids) >= 1024:  # a bound on memory for callers of many distinct M
                self._grids.clear()
            grid = self._grids[m] = self._grid(m)
        values, at = self._values, self._per_call
        values[at[ACTIVATION]], values[at[OUTPUT]] = a, out.data_ptr()
        values[at[ROWS]], values[at[LDA]], values[at[LDC]] = m, lda, out.stride(0)
        if self._a_maps is not None:  # (no rows: no unit reads the map)
            values[self._a_map_slot] = self._a_maps(a, m, lda) if m else bytes(MAP_BYTES)
        runtime.launch(self._fn, grid, self._block, self._smem, self._struct.pack(*values), cluster=self._cluster,
                       pdl=self._pdl)

    def moe(self, a: torch.Tensor, out: torch.Tensor, routing, top_k: int,
            topk_weights: torch.Tensor | None = None, a_scale: torch.Tensor | None = None,
            out_top_k: int | None = None, out_scale: torch.Tensor | None = None) -> None:
        """Launch an indexed MoE kernel: row i of `out` (M * top_k assignment rows, any order) is row i // top_k of
        `a` times its expert's weight, for the rows `routing` (a MoeAlignment of this kernel's block_m) lists;
        other rows are not written. `topk_weights` (M * top_k fp32) multiplies each row where the kernel does.
        Quantized activations: `a` holds the codes and `a_scale` their fp32 scales, per row of `a` (read through
        the same routing) or one per tensor. A kernel with the atomic top-k reduction (ComputeConfig.topk_reduce)
        adds assignment row i into row i // out_top_k of `out` instead (fp32, (rows / out_top_k, N), zeroed by the
        caller); only such a kernel takes `out_top_k`. A kernel whose epilogue quantizes its output
        (ComputeConfig.epilogue_quantization) writes codes into `out` (rows of bytes) and their scales into
        `out_scale` (per row of `out`, quantize_activation's layout), or reads a static per-tensor scale there."""
        slots = self._routing_slots
        if not slots or "expert_layout" in slots:
            raise ValueError(f"kernel {self.kernel.name} is not an indexed MoE kernel; call the launcher with (a, out)"
                             f" (dense) or Launcher.grouped (grouped MoE)")
        if ("topk_weights" in slots) != (topk_weights is not None):
            raise ValueError(f"kernel {self.kernel.name}: " + (
                "it multiplies by the router weights; pass topk_weights" if topk_weights is None
                else "topk_weights given, but this kernel does not multiply by them"))
        self._set_a_scale(a_scale)
        values = self._values
        rows = out.shape[0]
        slot = self._per_call.get(OUT_TOP_K)
        if (slot is None) != (out_top_k is None):
            raise ValueError(f"kernel {self.kernel.name}: " + (
                "it adds assignments into their tokens' rows (atomic top-k reduction); pass out_top_k"
                if out_top_k is None else "out_top_k given, but this kernel writes one row per assignment"))
        if slot is not None:
            values[slot] = out_top_k
            rows *= out_top_k  # m counts assignments, out_top_k per row of out
        out_scale_slot = self._per_call.get(OUTPUT_SCALE)
        if (out_scale is None) != (out_scale_slot is None):
            raise ValueError(f"kernel {self.kernel.name}: " + (
                "its epilogue quantizes the output; pass out_scale" if out_scale is None
                else "out_scale given, but this kernel's epilogue does not quantize its output"))
        if out_scale is not None:
            values[out_scale_slot] = out_scale.data_ptr()
        values[self._per_call[TOP_K]] = top_k
        values[slots["sorted_ids"]] = routing.sorted_ids.data_ptr()
        values[slots["expert_ids"]] = routing.expert_ids.data_ptr()
        values[slots["num_tokens_post_pad"]] = routing.num_tokens_post_pad.data_ptr()
        if topk_weights is not None:
            values[slots["topk_weights"]] = topk_weights.data_ptr()
        if self._scratch_slots and rows > self._scratch_rows:  # split-K: a bigger routing than bound (eager only)
            self._grow_scratch(rows)
        self._launch(a, out, rows)  # m counts assignment rows

    def grouped(self, a: torch.Tensor, out: torch.Tensor, expert_layout: torch.Tensor,
                a_scale: torch.Tensor | None = None) -> None:
        """Launch a grouped MoE kernel on rows of `a` into the same rows of `out`: grouped_masked, a and out are
        (E * max_m) rows and expert_layout (E,) int32 the rows of each expert in use (rows past it are not
        written); grouped_contiguous, expert e's rows are [expert_layout[e], expert_layout[e + 1]).
        Quantized activations: `a` holds the codes and `a_scale` their fp32 scales (per row of `a`, or one)."""
        slot = self._routing_slots.get("expert_layout")
        if slot is None:
            raise ValueError(f"kernel {self.kernel.name} is not a grouped MoE kernel")
        self._set_a_scale(a_scale)
        self._values[slot] = expert_layout.data_ptr()
        self._launch(a, out, a.shape[0])


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
