"""The MoE row compaction (humming_gen.moe.compact; GPU test: tests/gpu/test_quant_moe_grouped_down.py): rendering
(header with the full config, only the chosen branch), NVRTC compilation for the targets without spills, and its
torch reference against a brute force over moe_align's routing: every routed assignment's row lands in its expert's
window, in assignment order, the windows back to back from row 0; skipped assignments get -1 and no row."""

from __future__ import annotations

import json

import pytest
import torch

from humming_gen.moe.compact import (CompactConfig, compact_offsets, compact_rows, generate,
                                     param_fields, params_struct)
from humming_gen.reference.moe import moe_align_reference
from humming_gen.runtime.compile import compile_source
from humming_gen.targets import get_target

ARCHS = ["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"]


def test_header_holds_the_full_config_and_pdl_only_where_the_target_has_it():
    cfg = CompactConfig(get_target("sm_90a"))
    src = generate(cfg)
    line = next(l for l in src.splitlines() if l.startswith("//   moe_compact_rows "))
    assert json.loads(line.split("moe_compact_rows ", 1)[1]) == cfg.to_dict()
    assert "griddepcontrol.wait" in src and generate(cfg) == src
    assert "griddepcontrol" not in generate(CompactConfig(get_target("sm_80")))
    assert [f[0] for f in param_fields(cfg)][:3] == ["src", "dst", "rows"]
    assert params_struct(cfg).size == 9 * 8 + 3 * 4 + 4


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_spills(arch):
    from helpers import assert_no_spills

    cfg = CompactConfig(get_target(arch))
    compiled = compile_source(generate(cfg), cfg.kernel_name, arch)
    assert_no_spills(compiled, cfg.kernel_name)


@pytest.mark.parametrize("m, top_k, experts, block_m", [(1, 1, 1, 8), (37, 2, 4, 16), (300, 8, 19, 64),
                                                         (64, 4, 128, 128)])
def test_reference_fills_back_to_back_windows_in_assignment_order(m, top_k, experts, block_m):
    g = torch.Generator().manual_seed(m + experts)
    ids = torch.randint(-1, experts, (m, top_k), generator=g, dtype=torch.int32)
    routing = moe_align_reference(ids, experts, block_m)
    src = torch.randn(m * top_k, 24, generator=g).bfloat16()
    offsets = compact_offsets(routing.expert_counts)
    assert offsets.dtype == torch.int32 and offsets.tolist() == [0] + routing.expert_counts.cumsum(0).tolist()
    dst = torch.full_like(src, float("nan"))
    rows = compact_rows(src, routing, block_m, offsets, dst, get_target("sm_90a"))  # the CPU path: the reference
    # brute force: expert by expert, its assignments in index order
    want_rows, next_row = torch.full((m * top_k,), -1, dtype=torch.int32), 0
    flat = ids.reshape(-1)
    for e in range(experts):
        for i in (flat == e).nonzero().flatten().tolist():
            want_rows[i] = next_row
            next_row += 1
    assert torch.equal(rows, want_rows)
    assert next_row == offsets[-1]
    kept = want_rows >= 0
    assert torch.equal(dst[want_rows[kept].long()], src[kept])
    assert torch.isnan(dst[next_row:].float()).all()
