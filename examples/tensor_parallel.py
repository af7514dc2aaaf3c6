"""Tensor-parallel quantized MLP and MoE blocks on the GPUs of one host, all-reduced with NCCL, checked against the
unsharded blocks on one GPU and timed (CUDA graphs) on 1 and N GPUs.

    torchrun --nproc-per-node 2 examples/tensor_parallel.py [--scheme w4a16-int4-g128] [--m 1,64,1024]

MLP: gate and up column-parallel (QuantizedWeight.shard(0, ...): N splits, outputs stay on their rank), down
row-parallel (shard(1, ...): K splits, the ranks' outputs sum in one all-reduce). MoE: humming_gen.shard_moe keeps
every feature's gate and up rows on one rank and w2's matching input columns; one all-reduce sums the ranks' outputs.
Run as a single process (python examples/tensor_parallel.py) it checks the shards of a 2-way split on one GPU
instead, summing them locally. Without a GPU it only builds the shards' kernels for sm_90a.
"""

from __future__ import annotations

import argparse
import os

import torch

import humming_gen as hg
from humming_gen.bench.timing import graph_time_us

# MLP: a Llama-3-8B-sized block; MoE: 16 experts of I_MOE features, top-2 (I / 4 and I_MOE / 4 keep whole groups)
H, I, E, TOP_K, I_MOE = 4096, 14336, 16, 2, 1536
TOLERANCE = 2e-2  # relative Frobenius error of the sharded bf16 result against the unsharded one


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--scheme", default="w4a16-int4-g128")
    p.add_argument("--m", default="1,64,1024", help="token counts")
    return p.parse_args()


class Mlp:
    """silu(x @ gate^T) * (x @ up^T) @ down^T with quantized gate, up, down (each rank's part when sharded)."""

    def __init__(self, gate, up, down, **kw):
        self.gate = hg.QuantLinear.from_quantized(gate, **kw)
        self.up = hg.QuantLinear.from_quantized(up, **kw)
        self.down = hg.QuantLinear.from_quantized(down, **kw)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def graph_us(fn, x: torch.Tensor) -> float:
    """Median CUDA-graph time of fn(x) in microseconds (the benchmark method of docs/BENCHMARKS.md)."""
    return graph_time_us([fn], x)


def main() -> None:
    args = parse()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    distributed = world > 1
    gpu = torch.cuda.is_available()
    if distributed:
        import torch.distributed as dist

        if not gpu:
            raise SystemExit(f"examples/tensor_parallel.py: {world} processes (torchrun) need a CUDA GPU each; "
                             f"without a GPU run it as one process (python examples/tensor_parallel.py), which "
                             f"builds the shards' kernels only")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl")
    shards = world if distributed else 2  # single process: check a 2-way split locally
    device = "cuda" if gpu else "cpu"
    build = {} if gpu else dict(target="sm_90a", device="cpu")
    # without a GPU only the kernels are built: small shapes keep the CPU quantization quick
    h, i, i_moe = (H, I, I_MOE) if gpu else (512, 1024, 256)
    scheme = hg.scheme(args.scheme)
    torch.manual_seed(0)  # every rank quantizes the same weights, then keeps its part
    gate, up, down = (scheme.quantize(torch.randn(n, k, device=device) * 0.02)
                      for n, k in ((i, h), (i, h), (h, i)))
    q13 = scheme.quantize(torch.randn(E, 2 * i_moe, h, device=device) * 0.02)
    q2 = scheme.quantize(torch.randn(E, h, i_moe, device=device) * 0.02)
    ranks = [rank] if distributed else list(range(shards))
    mlps = [Mlp(gate.shard(0, r, shards), up.shard(0, r, shards), down.shard(1, r, shards), **build) for r in ranks]
    moes = []
    for r in ranks:
        s = hg.shard_moe(q13, q2, r, shards)
        moes.append(hg.QuantMoE.from_quantized(s.q13, s.q2, **build))
    if not gpu:
        print(f"built the kernels of {len(mlps)} MLP and {len(moes)} MoE shards for sm_90a (no GPU: nothing runs)")
        return

    full_mlp = Mlp(gate, up, down)
    full_moe = hg.QuantMoE.from_quantized(q13, q2)

    def all_reduce(y: torch.Tensor) -> torch.Tensor:
        if distributed:
            dist.all_reduce(y)
        return y

    def mlp_tp(x):
        parts = [mlp(x) for mlp in mlps]
        return all_reduce(parts[0] if distributed else sum(parts))

    rows = []
    for m in (int(v) for v in args.m.split(",")):
        torch.manual_seed(m)  # the same x and routing on every rank
        x = torch.randn(m, h, device="cuda").bfloat16()
        weights, ids = torch.topk(torch.softmax(torch.randn(m, E, device="cuda"), -1), TOP_K, dim=-1)
        ids = ids.to(torch.int32)

        def moe_tp(x, weights=weights, ids=ids):
            parts = [layer(x, weights, ids) for layer in moes]
            return all_reduce(parts[0] if distributed else sum(parts))

        for name, tp, full in (("mlp", mlp_tp, full_mlp),
                               ("moe", moe_tp, lambda x, weights=weights, ids=ids: full_moe(x, weights, ids))):
            y, ref = tp(x).double(), full(x).double()
            err = ((y - ref).norm() / ref.norm()).item()
            assert err < TOLERANCE, f"{name} m={m}: sharded result differs from the unsharded one by {err:.2e}"
            t_tp, t_one = graph_us(tp, x), graph_us(full, x)
            t_ar = graph_us(all_reduce, torch.empty(m, h, device="cuda", dtype=torch.bfloat16)) if distributed else 0.0
            rows.append((name, m, t_one, t_tp, t_ar, err))
    if rank == 0:
        label = f"{world} GPUs" if distributed else "2 shards on 1 GPU"
        print(f"| block | M | 1 GPU (us) | {label} (us) | all-reduce (us) | share | rel. error |")
        print("|---|---|---|---|---|---|---|")
        for name, m, t_one, t_tp, t_ar, err in rows:
            print(f"| {name} | {m} | {t_one:.1f} | {t_tp:.1f} | {t_ar:.1f} | {t_ar / t_tp:.0%} | {err:.1e} |")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
