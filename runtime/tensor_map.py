"""TMA tensor maps of activation matrices: cuTensorMapEncodeTiled's 128 bytes, which a kernel with a TensorMap field
reads from its parameters (warp-specialized dense kernels with a_load='tma').

Encoding is host work (no GPU call) of a few microseconds through cuda-bindings, so `ActivationMaps` keeps the maps
of the last few (address, rows, row stride) a launcher saw: a serving loop that reuses its buffers encodes once.
"""

from __future__ import annotations

import ctypes
from humming_gen.runtime.module import driver, error_string

PANEL_ELEMENTS = 64  # a box row: 64 16-bit elements = 128 bytes, the span of the 128-byte swizzle
MAX_BOX_ROWS = 256
MAP_BYTES = 128
_DTYPES = {"bfloat16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "float16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"}


def encode_activation_map(address: int, dtype: str, rows: int, cols: int, row_stride: int, box_rows: int) -> bytes:
    """The tensor map of a (rows, cols) 16-bit matrix at `address` with `row_stride` elements between rows, read in
    boxes of 64 columns x box_rows rows into 128-byte-swizzled shared memory (wgmma's K-major layout); elements
    past the matrix read as zeros. ValueError where TMA cannot address it (address or row stride not a multiple of
    16 bytes, a box of more than 256 rows)."""
    if dtype not in _DTYPES:
        raise ValueError(f"tensor map dtype {dtype!r}; allowed: {sorted(_DTYPES)}")
    if address % 16 or (row_stride * 2) % 16 or rows < 1 or cols < 1 or row_stride < cols:
        raise ValueError(f"a TMA tensor map needs a 16-byte aligned address and row stride, rows >= 1 and a row "
                         f"stride of at least the columns: got address {address:#x}, rows {rows}, cols {cols}, row "
                         f"stride {row_stride} elements")
    if not 1 <= box_rows <= MAX_BOX_ROWS:
        raise ValueError(f"box_rows={box_rows}: 1 to {MAX_BOX_ROWS}")
    drv = driver()
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    result, tensor_map = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, _DTYPES[dtype]), 2, address, [u64(cols), u64(rows)], [u64(row_stride * 2)],
        [u32(PANEL_ELEMENTS), u32(box_rows)], [u32(1), u32(1)], drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if result != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed: {error_string(result)} (address {address:#x}, rows {rows}, "
                           f"cols {cols}, row stride {row_stride}, box 64 x {box_rows})")
    return ctypes.string_at(tensor_map.getPtr(), MAP_BYTES)


class ActivationMaps:
    """The activation tensor maps of one kernel (dtype, columns and box fixed), by (address, rows, row stride)."""

    __slots__ = ("dtype", "cols", "box_rows", "_maps")
    LIMIT = 64  # maps remembered; past it the cache starts over

    def __init__(self, dtype: str, cols: int, box_rows: int):
        self.dtype, self.cols, self.box_rows = dtype, cols, box_rows
        self._maps: dict[tuple[int, int, int], bytes] = {}

    def __call__(self, address: int, rows: int, row_stride: int) -> bytes:
        key = (address, rows, row_stride)
        found = self._maps.get(key)
        if found is None:
            if len(self._maps) >= self.LIMIT:
                self._maps.clear()
            found = self._maps[key] = encode_activation_map(address, self.dtype, rows, self.cols, row_stride,
                                                            self.box_rows)
        return found

    def __repr__(self) -> str:
        return f"ActivationMaps({self.dtype}, cols={self.cols}, box 64 x {self.box_rows}, {len(self._maps)} held)"
