"""Routing cases shared by the moe_align tests (CPU and GPU): random top-k ids with -1 slots and out-of-range
ids, expert maps of expert parallelism, and the brute-force definition of moe_align's outputs; and the pipeline
rule the QuantMoE tests state (w8a8)."""

from __future__ import annotations

import torch


def random_ids(m: int, topk: int, num_ids: int, seed: int, *, dropped: float = 0.0, dtype=torch.int64,
               out_of_range: bool = False) -> torch.Tensor:
    """(m, topk) ids in [0, num_ids), a fraction `dropped` set to -1, and (out_of_range) some ids past the end and
    below -1, which the kernels skip."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, num_ids, (m, topk), generator=g)
    ids[torch.rand(m, topk, generator=g) < dropped] = -1
    if out_of_range:
        bad = torch.rand(m, topk, generator=g) < 0.1
        ids[bad] = torch.where(torch.rand(m, topk, generator=g) < 0.5, num_ids + 3, -5)[bad]
    return ids.to(dtype)


def expert_map(num_global: int, num_local: int, rank: int, seed: int, dtype=torch.int32) -> torch.Tensor:
    """Global -> local map of one rank holding num_local of num_global experts (a random subset), -1 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(num_global, generator=g)[rank * num_local: (rank + 1) * num_local]
    table = torch.full((num_global,), -1, dtype=torch.int64)
    table[chosen] = torch.arange(num_local)
    return table.to(dtype)


def brute_force(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                expert_map: torch.Tensor | None = None) -> dict[str, list[int]]:
    """moe_align's outputs from their definition, one assignment at a time in plain Python."""
    ids = topk_ids.reshape(-1).tolist()
    table = expert_map.tolist() if expert_map is not None else list(range(num_experts))
    numel = len(ids)
    runs: list[list[int]] = [[] for _ in range(num_experts)]
    inverse = [-1] * numel
    for i, gid in enumerate(ids):
        if 0 <= gid < len(table) and 0 <= table[gid] < num_experts:
            runs[table[gid]].append(i)
    sorted_ids, expert_ids, offsets = [], [], []
    for e, run in enumerate(runs):
        offsets.append(len(sorted_ids))
        for i in run:
            inverse[i] = len(sorted_ids)
            sorted_ids.append(i)
        while len(sorted_ids) % block_m:
            sorted_ids.append(numel)
        expert_ids += [e] * ((len(sorted_ids) - offsets[-1]) // block_m)
    total = len(sorted_ids)
    offsets.append(total)
    worst = numel + min(num_experts, numel) * (block_m - 1)
    max_padded = -(-worst // block_m) * block_m
    return {"sorted_ids": sorted_ids + [numel] * (max_padded - total),
            "expert_ids": expert_ids + [-1] * (max_padded // block_m - len(expert_ids)),
            "num_tokens_post_pad": [total], "expert_offsets": offsets,
            "expert_counts": [len(r) for r in runs], "inverse": inverse}


def w8a8(preset: str) -> bool:
    """Whether a preset's MoE layers take the warp-specialized kernels in every bucket on sm_90a by default: 8-bit
    weights with 8-bit activations (humming_gen.heuristics.choose.ws_moe_from_rows; stated here, not asked of it)."""
    import humming_gen as hg

    s = hg.scheme(preset)
    return s.weight.bits == 8 and s.activation is not None
