"""Host time of one eager forward call, measured on the CPU (no GPU needed): the layers are built for sm_90a on the
CPU and only the driver call is stubbed (cuLaunchKernelEx, module load, the current stream), so everything else a
GPU call does on the host runs: checks, activation quantization, moe_align's launch path, the Launcher's packing
and runtime.launch's config lookup and params copy. Torch ops a GPU call would launch run here on CPU tensors (tiny
at M = 1, but their arithmetic counts: the MoE's gated activation and top-k sum cost some 25 us of the total), so
their host cost is roughly that of their CUDA launch. moe_align's id range check on CPU tensors (min / max, about
2 us) is skipped for CUDA tensors.

    python bench/host_overhead.py [calls] [--profile]

Prints us per call for QuantLinear 16-bit / 8-bit activations and QuantMoE 16-bit / 8-bit activations at M = 1,
each through forward and through the op's eager body (QuantLinear: run_gemm; QuantMoE: run) directly: forward
takes the direct path in plain eager calls (humming_gen/layer/eager.py), so the two differ by the module call.
"""

from __future__ import annotations

import argparse
import cProfile
import contextlib
import pstats
import sys
import time

import torch

import humming_gen as hg
import humming_gen.runtime as runtime
from humming_gen.runtime.module import LoadedKernel

launch_mod = sys.modules["humming_gen.runtime.launch"]  # the package's `launch` attribute is the function

E, TOP_K, H, I = 128, 8, 256, 128   # Qwen3-30B-A3B's experts and top-k; small H / I: less CPU arithmetic
N = K = 2048


class _Device:
    """torch.cuda.device's work on a CUDA build (exchange the device on enter and exit) without CUDA."""

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        self.prev = int(self.index)

    def __exit__(self, *exc):
        self.prev = int(self.index)
        return False


def stub_driver() -> None:
    """Everything below the driver call runs; load, the launch config build and cuLaunchKernelEx do nothing."""
    def load(compiled, smem=0):
        return LoadedKernel(compiled=compiled, function=None, device=0, dynamic_smem_bytes=smem, num_regs=0,
                            static_smem_bytes=0, max_dynamic_smem_bytes=1 << 20, local_bytes=0,
                            max_threads_per_block=1024, param_size=None)

    runtime.load = load
    launch_mod._make_config = lambda *args: (object(), [])
    launch_mod._launch_fn = lambda config, fn, argv, zero: (0,)
    launch_mod._success = 0
    launch_mod._stream_getter = lambda: 0
    torch.cuda.current_device = lambda: 0
    torch.cuda.device = _Device
    # the CUDA branches of quantize_activation and moe_align on CPU tensors
    import humming_gen.activation.api as api
    import humming_gen.moe.align as align

    target = hg.targets.get_target("sm_90a")
    api._target = lambda device: target
    align._target = lambda index: target
    api._DEVICE_TYPES = ("cpu",)

    def align_cuda_path(topk_ids, num_experts, block_m, expert_map=None):
        outputs = align._empty_outputs(topk_ids, num_experts, block_m)
        align._launch(topk_ids, num_experts, block_m, expert_map, outputs)
        return outputs

    align.moe_align_reference = align_cuda_path


def per_call_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def cases():
    torch.manual_seed(0)
    x = torch.randn(1, K).bfloat16()
    out = []
    for fmt in ("w4a16-int4-g128", "w8a8-fp8-channel", "w8a8-int8-channel", "w8a8-fp8-block128", "w4a8-mxfp4-fp8"):
        name = f"QuantLinear {fmt}"
        layer = hg.QuantLinear.from_quantized(hg.scheme(fmt).quantize(torch.randn(N, K) * 0.02), target="sm_90a",
                                              device="cpu")
        out.append((name, lambda layer=layer: layer(x), lambda layer=layer: _gemm_body(layer, x)))
    xm = torch.randn(1, H).bfloat16()
    weights, ids = torch.topk(torch.rand(1, E), TOP_K, dim=-1)
    ids = ids.to(torch.int32)
    for name, fmt in (("QuantMoE W4A16", "w4a16-int4-g128"), ("QuantMoE W8A8", "w8a8-fp8-channel")):
        s = hg.scheme(fmt)
        moe = hg.QuantMoE.from_quantized(s.quantize(torch.randn(E, 2 * I, H) * 0.02),
                                         s.quantize(torch.randn(E, H, I) * 0.02), target="sm_90a", device="cpu")
        out.append((name, lambda moe=moe: moe(xm, weights, ids), lambda moe=moe: moe.run(xm, weights, ids)))
    return out


def _gemm_body(layer, x):
    """What humming_gen::gemm's eager implementation does, without the op dispatch."""
    from humming_gen.layer import ops

    return ops.run_gemm(layer, x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("calls", nargs="?", type=int, default=2000, help="calls per timing (default: %(default)s)")
    parser.add_argument("--profile", action="store_true", help="also cProfile each case's forward calls")
    args = parser.parse_args()
    calls = args.calls
    torch.set_num_threads(1)  # the torch ops' arithmetic on one thread: less noise
    stub_driver()
    built = cases()
    print("| case | forward us | body without op dispatch us |\n|---|---|---|")
    for name, forward, body in built:
        with contextlib.suppress(Exception):
            body()
        print(f"| {name} | {per_call_us(forward, calls):.1f} | {per_call_us(body, calls):.1f} |", flush=True)
    if args.profile:
        for name, forward, _ in built:
            print(f"\n=== {name}")
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                forward()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
