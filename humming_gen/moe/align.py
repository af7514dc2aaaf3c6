"""`humming_gen.moe_align` and its custom op `humming_gen::moe_align`: MoE routing on the GPU without a host sync.

Every output is sized from M, topk, E and block_m alone (the fake implementation gives the same shapes), so the op
can be captured in a CUDA graph and replayed with new topk_ids, and torch.compile sees no data-dependent shape.
On CUDA the generated kernels of humming_gen.moe.kernel run on torch's current stream; on the CPU the op is the
torch reference (humming_gen.reference.moe), which defines the outputs bit for bit.
"""

from __future__ import annotations

import contextlib

import torch

from humming_gen.layer.eager import direct_call
from humming_gen.moe.kernel import CHUNK, MAX_EXPERTS, SINGLE_MAX, AlignConfig, build
from humming_gen.reference.moe import MoeAlignment, max_padded_size, moe_align_reference
from humming_gen.targets import Target

_INDEX_DTYPES = {torch.int32: "int32", torch.int64: "int64"}
_targets: dict[int, Target] = {}


def _target(index: int) -> Target:
    found = _targets.get(index)
    if found is None:
        found = _targets[index] = Target.current(index)
    return found


def _check(topk_ids: torch.Tensor, num_experts: int, block_m: int, expert_map: torch.Tensor | None,
           values: bool = True) -> None:
    """ValueError / TypeError naming the argument, before anything is launched. Id values (`values`) are checked
    only for CPU tensors (on a GPU that would be a host sync: the kernels skip ids outside the range), and only in
    the op itself, where torch.compile does not trace them."""
    name = "humming_gen.moe_align"
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"{name}: topk_ids must be a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{name}: topk_ids.dtype is {topk_ids.dtype}; allowed: int32, int64")
    if topk_ids.dim() != 2:
        raise ValueError(f"{name}: topk_ids must be (M, topk), got shape {tuple(topk_ids.shape)}")
    if not topk_ids.is_contiguous():
        raise ValueError(f"{name}: topk_ids must be contiguous, got strides {topk_ids.stride()} for shape "
                         f"{tuple(topk_ids.shape)}; pass topk_ids.contiguous()")
    if topk_ids.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name}: topk_ids is on {topk_ids.device}; allowed: a CUDA device (kernels) or the CPU "
                         f"(reference)")
    for arg, value in (("num_experts", num_experts), ("block_m", block_m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: {arg} must be an int >= 1, got {value!r}")
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"{name}: num_experts = {num_experts} is above {MAX_EXPERTS} (the kernels keep a row of "
                         f"counts per expert and warp in shared memory)")
    numel = topk_ids.numel()
    if max_padded_size(numel, num_experts, block_m) + CHUNK >= 2 ** 31:
        raise ValueError(f"{name}: M * topk = {numel} with num_experts = {num_experts} and block_m = {block_m} "
                         f"pads beyond the kernels' 32-bit positions")
    num_ids = num_experts
    if expert_map is not None:
        if not isinstance(expert_map, torch.Tensor):
            raise TypeError(f"{name}: expert_map must be a torch.Tensor or None, got {type(expert_map).__name__}")
        if expert_map.dtype not in _INDEX_DTYPES or expert_map.dim() != 1 or not expert_map.is_contiguous():
            raise ValueError(f"{name}: expert_map must be a contiguous 1-D int32 / int64 tensor (global expert id -> "
                             f"local expert, -1 for other ranks' experts), got dtype {expert_map.dtype}, shape "
                             f"{tuple(expert_map.shape)}, strides {expert_map.stride()}")
        if expert_map.device != topk_ids.device:
            raise ValueError(f"{name}: expert_map is on {expert_map.device}, topk_ids on {topk_ids.device}")
        num_ids = expert_map.numel()
        if values and expert_map.device.type == "cpu" and expert_map.numel():
            low, high = int(expert_map.min()), int(expert_map.max())
            if low < -1 or high >= num_experts:
                raise ValueError(f"{name}: expert_map values must lie in [-1, {num_experts}) (local experts, -1 for "
                                 f"other ranks), got range [{low}, {high}]")
    if values and topk_ids.device.type == "cpu" and numel:
        low, high = int(topk_ids.min()), int(topk_ids.max())
        if low < -1 or high >= num_ids:
            raise ValueError(f"{name}: topk_ids must lie in [-1, {num_ids}) (-1: no expert), got range "
                             f"[{low}, {high}]")


def _empty_outputs(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, ...]:
    numel = topk_ids.numel()
    max_padded = max_padded_size(numel, num_experts, block_m)
    device, i32, empty = topk_ids.device, torch.int32, torch.empty  # (fake tensors under a fake mode)
    return (empty(max_padded, dtype=i32, device=device), empty(max_padded // block_m, dtype=i32, device=device),
            empty(1, dtype=i32, device=device), empty(num_experts + 1, dtype=i32, device=device),
            empty(num_experts, dtype=i32, device=device), empty(numel, dtype=i32, device=device))


def _align(topk_ids: torch.Tensor, num_experts: int, block_m: int,
           expert_map: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The eager body of `humming_gen::moe_align` (moe_align calls it without the op where that is the same:
    humming_gen.layer.eager)."""
    _check(topk_ids, num_experts, block_m, expert_map)
    if topk_ids.device.type == "cpu":
        return tuple(moe_align_reference(topk_ids, num_experts, block_m, expert_map))
    outputs = _empty_outputs(topk_ids, num_experts, block_m)
    _launch(topk_ids, num_experts, block_m, expert_map, outputs)
    return outputs


@torch.library.custom_op("humming_gen::moe_align", mutates_args=())
def _moe_align_op(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                  expert_map: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                            torch.Tensor, torch.Tensor]:
    """(sorted_ids, expert_ids, num_tokens_post_pad, expert_offsets, expert_counts, inverse); see MoeAlignment."""
    return _align(topk_ids, num_experts, block_m, expert_map)


@_moe_align_op.register_fake
def _moe_align_fake(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                    expert_map: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return _empty_outputs(topk_ids, num_experts, block_m)


def _launch(topk_ids: torch.Tensor, num_experts: int, block_m: int, expert_map: torch.Tensor | None,
            outputs: tuple[torch.Tensor, ...]) -> None:
    """One kernel (numel <= SINGLE_MAX) or the count + scatter pair, on the current stream."""
    sorted_ids, expert_ids, total, offsets, counts, inverse = outputs
    device = topk_ids.device
    current = torch.cuda.current_device()
    index = device.index if device.index is not None else current
    target = _target(index)
    numel = topk_ids.numel()
    id_dtype = _INDEX_DTYPES[topk_ids.dtype]
    map_dtype = _INDEX_DTYPES[expert_map.dtype] if expert_map is not None else None
    values = {"topk_ids": topk_ids.data_ptr(), "expert_map": expert_map.data_ptr() if expert_map is not None else 0,
              "sorted_ids": sorted_ids.data_ptr(), "expert_ids": expert_ids.data_ptr(), "total": total.data_ptr(),
              "expert_offsets": offsets.data_ptr(), "expert_counts": counts.data_ptr(),
              "inverse": inverse.data_ptr(), "numel": numel,
              "num_ids": expert_map.numel() if expert_map is not None else num_experts,
              "num_experts": num_experts, "block_m": block_m, "max_padded": sorted_ids.numel()}
    # NOTE: the device switch only where needed: entering torch.cuda.device costs about as much as a launch
    with torch.cuda.device(index) if index != current else contextlib.nullcontext():
        if numel <= SINGLE_MAX:
            kernel = _kernel("single", id_dtype, map_dtype, target)
            warps = kernel.config.threads // 32
            values["chunk"] = -(-numel // (32 * warps)) * 32 * warps  # whole 32-wide steps per warp
            kernel.launch(1, values, num_experts, index)
            return
        grid = -(-numel // CHUNK)
        partials = torch.empty(grid * num_experts, dtype=torch.int32, device=device)
        values.update(chunk=CHUNK, partials=partials.data_ptr())
        _kernel("count", id_dtype, map_dtype, target).launch(grid, values, num_experts, index)
        _kernel("scatter", id_dtype, map_dtype, target).launch(grid, values, num_experts, index)


_kernels: dict[tuple, object] = {}


def _kernel(kind: str, id_dtype: str, map_dtype: str | None, target: Target):
    """build(AlignConfig(...)) without building and hashing the config on every call."""
    key = (kind, id_dtype, map_dtype, id(target))
    found = _kernels.get(key)
    if found is None or found.config.target is not target:
        found = _kernels[key] = build(AlignConfig(kind, id_dtype, map_dtype, target))
    return found


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int,
              expert_map: torch.Tensor | None = None) -> MoeAlignment:
    """Group the M x topk expert assignments by expert, padded per expert to block_m rows (the MoE GEMM's tile).

    topk_ids: (M, topk) int32 / int64, contiguous, on a CUDA device (generated kernels, no host sync) or the CPU
        (the torch reference). Ids outside the valid range are skipped like -1 ("no expert"); on the CPU anything
        but -1 outside the range raises instead.
    num_experts: experts of this rank's GEMM (local experts, at most 1024); the range of expert_ids.
    block_m: rows per GEMM tile; each expert's run in sorted_ids is padded to a multiple of it.
    expert_map: optional (num_global_experts,) int32 / int64 on topk_ids' device, global id -> local expert, -1 for
        experts of other ranks (their assignments are skipped). With a map, topk_ids hold global ids.

    Returns a MoeAlignment (int32 tensors on topk_ids' device) sized for the worst case from M, topk, num_experts
    and block_m. Within an expert, assignments keep their order (index m * topk + j): results are reproducible.
    Raises ValueError / TypeError naming the argument before anything is launched.
    """
    if direct_call(topk_ids, expert_map):
        return MoeAlignment(*_align(topk_ids, num_experts, block_m, expert_map))
    _check(topk_ids, num_experts, block_m, expert_map, values=False)
    return MoeAlignment(*torch.ops.humming_gen.moe_align(topk_ids, num_experts, block_m, expert_map))
