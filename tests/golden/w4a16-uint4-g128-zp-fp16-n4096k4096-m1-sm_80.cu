// humming_gen 0.1.0 - generated; edit templates/, not this file
// kernel  gemm_wuint4g128zisbfloat16_afloat16_n4096k4096_sm_80_8x128x256s3w1x2x4k7   key 06af6acf1a7f
// layer   n=4096 k=4096 weight=uint4 scale=bfloat16/g128 zero_point=int act=16-bit dtype=float16 out=float16 bias=no
// compute gemm=dense batch_invariant=no accum=float32 input_scale=row_major epilogue=[]
// tuning  pipeline=standard mma=m16n8k16 block=8x128x256 warps=1x2x4 stages=3 split_k=7 stream_k=no load=a:cp_async,b:cp_async,scale:cp_async ctas_per_sm=2 raster=n_major cluster=1x1
// target  sm_80   compiler nvrtc 13.0   options -arch=sm_80 --std=c++17 -default-device --ptxas-options=-O3 --ptxas-options=-v -DNDEBUG
// components (in order):
//   ptx.SmemAddress()
//   ptx.CpAsync()
//   ptx.Ldmatrix(x4=False, x2=True)
//   ptx.Prmt()
//   ptx.AndOr()
//   ptx.Fma2(dtype='float16')
//   ptx.CvtScalar(dtype='float16', out_dtype='float16', to_float=False)
//   ptx.GlobalSync()
//   numeric.PlaneExtract(bits=4, or_bits='0x64006400')
//   numeric.IntZeroPoint(dtype='float16')
//   memory.ATileCpAsync(dtype='float16', block_k=256, warp_m_tiles=1)
//   memory.BChunkShared(bits=4)
//   memory.BTileCpAsync(bits=4, tile_bytes=16384)
//   memory.GroupParamsCpAsync(dtype='float16', tensors=('b_scale', 'b_zero'))
//   memory.GroupParamsShared(dtype='float16', tensors=('b_scale', 'b_zero'), float_scales=True, pair_loads=True)
//   mma.MmaSyncM16N8K16(dtype='float16')
//   schedule.DenseSplitKSchedule(split_k=7)
//   epilogue.WarpKReduce(warps_k=4)
//   epilogue.SplitKReduce(split_k=7)
//   epilogue.StoreOutput(dtype='float16', out_dtype='float16', out_scale=False, bias=False)
//   pipeline.StandardPipeline(kernel_name='gemm_wuint4g128zisbfloat16_afloat16_n4096k4096_sm_80_8x128x256s3w1x2x4k7', group_params=('b_scale', 'b_zero'), hoist_group_params=True, slice_scale=True, dequant_params=('zero',), convert_in_extract=True, warp_k_reduce=True, split_k=True, min_blocks=2, pdl=False)
// full configs (JSON):
//   layer   {"dtype": "float16", "has_bias": false, "k": 4096, "n": 4096, "num_experts": 1, "out_dtype": "float16", "scheme": {"activation": null, "block_size": null, "global_scale": false, "granularity": "group", "group_size": 128, "scale_dtype": "bfloat16", "scale_rule": "rceil", "weight": "uint4", "zero_point": "int", "zero_point_dtype": null}, "top_k": 1}
//   compute {"accumulate": "float32", "batch_invariant": false, "epilogue_activation": null, "gemm": "dense", "input_scale_layout": "row_major", "topk_weight": false}
//   tuning  {"a_load": "cp_async", "b_load": "cp_async", "block_k": 256, "block_m": 8, "block_n": 128, "cluster_m": 1, "cluster_n": 1, "ctas_per_sm": 2, "mma": "m16n8k16", "pipeline": "standard", "raster": "n_major", "scale_load": "cp_async", "split_k": 7, "stages": 3, "stream_k": false, "warps_k": 4, "warps_m": 1, "warps_n": 2}

typedef unsigned int u32;
typedef unsigned short u16;

// Tile geometry and problem constants (every config value appears once, here).
namespace hg::cfg {
constexpr int kN = 4096;  // output features
constexpr int kKA = 4096;  // activation columns (rows are padded to 16 bytes)
constexpr int kNPad = 4096;  // N padded to the weight layout's block_n
constexpr int kBlockM = 8;
constexpr int kBlockN = 128;
constexpr int kBlockK = 256;
constexpr int kWarpsN = 2;
constexpr int kWarpsK = 4;
constexpr int kWarpsMN = 2;
constexpr int kWarpM = 8;  // warp tile
constexpr int kWarpN = 64;
constexpr int kWarpK = 64;
constexpr int kWarpMTiles = 1;  // m8 mma tiles per warp
constexpr int kWarpNTiles = 4;  // n16 mma tiles per warp
constexpr int kChunksPerWarp = 1;  // 16-tile weight chunks per warp and stage
constexpr int kThreads = 256;
constexpr int kStages = 3;  // cp.async ring depth
constexpr int kKTiles = 16;  // k tiles of kBlockK covering K
constexpr int kBStride = 16384;  // 16-byte chunks per n block of the packed weight
constexpr int kSplitK = 7;  // k slices reduced in the epilogue
constexpr int kGroupRows = 2;  // group-parameter rows per stage
constexpr int kGroupSizeInStage = 128;  // k elements per group row inside a stage
constexpr int kGroupRowsPerKTile = 2;
constexpr int kKTilesPerGroup = 1;
constexpr int kAStageBytes = 4096;
constexpr int kStageBytes = 21504;
constexpr int kBScaleOffset = 20480;  // b_scale rows in a stage
constexpr int kBZeroOffset = 20992;  // b_zero rows in a stage
}  // namespace hg::cfg

// Kernel argument: one struct passed by value, packed by humming_gen.kernel.Kernel.launch in this field order.
struct Params {
  const void* a;  // activations (m, k) float16, row stride lda
  const void* b;  // packed weights (humming_gen.schemes.packing)
  const void* b_scale;  // group scales [group][n_pad] float16
  const void* b_zero;  // negated zero terms [group][n_pad] float16
  void* c;  // output (m, n) float16, row stride ldc
  void* workspace;  // fp32 split-K partial tiles
  void* counters;  // int32 arrival counter per output tile, zero between launches
  int m;  // rows of a and c
  int lda;  // row stride of a, elements
  int ldc;  // row stride of c, elements
};

namespace hg {

// ======================================== ptx

// ---- ptx.SmemAddress()
// ptx: generic -> shared-window address, the operand form cp.async and ldmatrix take.
__device__ __forceinline__ u32 smem_address(const void* p) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
  return addr;
}

// ---- ptx.CpAsync()
// ptx: 16-byte global->shared copy that bypasses L1; src_bytes = 0 writes zeros (out-of-range rows and columns).
__device__ __forceinline__ void cp_async_16(u32 smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

// ---- ptx.Ldmatrix(x4=False, x2=True)
// ptx: two 8x8 b16 matrices from shared memory into mma fragments.
__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 { %0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// ---- ptx.Prmt()
// ptx: byte permute, used to broadcast one 16-bit lane into a pair or to merge two lanes.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 selector) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// ---- ptx.AndOr()
// ptx: (a & mask) | bits in one LOP3; written out because NVRTC 13.0 splits the C expression into two.
__device__ __forceinline__ u32 and_or(u32 a, u32 mask, u32 bits) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(mask), "r"(bits));
  return d;
}

// ---- ptx.Fma2(dtype='float16')
// ptx: packed float16 pair a * b + c, rounded to nearest (the only packed float16 op on every target).
__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// ---- ptx.CvtScalar(dtype='float16', out_dtype='float16', to_float=False)
// ptx: single fp32 <-> 16-bit conversions for the epilogue.
__device__ __forceinline__ u16 from_float(float x) {
  u16 d;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(d) : "f"(x));
  return d;
}

// ---- ptx.GlobalSync()
// ptx: split-K hand-off between CTAs: release partial sums, count arrivals, acquire the others' sums.
__device__ __forceinline__ int arrive_and_count(int* counter) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  return old;
}
__device__ __forceinline__ void reset_counter(int* counter) {
  asm volatile("st.relaxed.gpu.global.s32 [%0], 0;\n" ::"l"(counter) : "memory");
}
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ float load_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}

// ======================================== numeric

// ---- numeric.PlaneExtract(bits=4, or_bits='0x64006400')
// numeric: 4-bit code pairs from 1 bit plane(s) of widths 4
// (layout of humming_gen.schemes.packing): register `reg` of a 16-tile chunk lands with its two codes in the
// low bits of each 16-bit lane, OR-ed into 0x64006400. `reg` is a compile-time constant after unrolling, so
// words[] stays in registers and every shift below is one instruction (or none).
constexpr int kChunkWords = 16;
constexpr u32 kOrBits = 0x64006400u;
__device__ __forceinline__ u32 extract_code_pair(const u32 (&words)[kChunkWords], int reg) {
  const u32 plane0 = words[0 + reg / 4] >> (reg % 4 * 4);
  u32 pair = and_or(plane0, 0x000F000Fu, kOrBits);
  return pair;
}

// ---- numeric.IntZeroPoint(dtype='float16')
// numeric: value = x - (bias + zero point); the group scale is applied to fp32 partial sums later.
// x is the converted pair; zero a (float16, float16) pair for the fragment's row.
__device__ __forceinline__ u32 dequant_pair(u32 x, u32 zero) {
  return fma2(x, 0x3C003C00u, zero);
}

// ======================================== memory

// ---- memory.ATileCpAsync(dtype='float16', block_k=256, warp_m_tiles=1)
// memory: activation tile (kBlockM x kBlockK float16, row-major) global -> shared with cp.async. 16-byte chunks
// are XOR-swizzled by row so that the 8 rows an ldmatrix reads fall in different banks; rows >= m and columns
// >= k are zero-filled. Fragments for mma operand B (k16 x n8, "col") come back through ldmatrix.
constexpr int kAChunksPerRow = cfg::kBlockK / 8;
constexpr int kAStageChunks = cfg::kBlockM * kAChunksPerRow;
constexpr int kASwizzle = 7;

__device__ __forceinline__ int a_smem_chunk(int row, int chunk) {
  return row * kAChunksPerRow + (chunk ^ (row & kASwizzle));
}

__device__ __forceinline__ void load_a_stage(u16* a_smem_stage, const u16* a, int lda, int m, int k, int m0, int k0) {
#pragma unroll
  for (int j = 0; j < (kAStageChunks + cfg::kThreads - 1) / cfg::kThreads; ++j) {
    const int i = threadIdx.x + j * cfg::kThreads;
    if (kAStageChunks % cfg::kThreads == 0 || i < kAStageChunks) {
      const int row = i / kAChunksPerRow, chunk = i % kAChunksPerRow;
      const int gm = m0 + row, gk = k0 + chunk * 8;
      const bool valid = gm < m && gk < k;
      const u16* src = valid ? a + (long long)gm * lda + gk : a;
      cp_async_16(smem_address(a_smem_stage + a_smem_chunk(row, chunk) * 8), src, valid ? 16 : 0);
    }
  }
}

// B-operand fragments of one k16 step for the warp's kWarpMTiles m8 tiles.
__device__ __forceinline__ void load_a_fragments(u32 (&frag)[cfg::kWarpMTiles][2], const u16* a_smem_stage,
                                                 int m_base, int k_base) {
  const int lane = threadIdx.x % 32;
  {  // the last, unpaired m8 tile
    const int row = m_base + (cfg::kWarpMTiles - 1) * 8 + lane % 8;
    ldmatrix_x2(frag[cfg::kWarpMTiles - 1], smem_address(a_smem_stage + a_smem_chunk(row, k_base / 8 + (lane / 8) % 2) * 8));
  }
}

// ---- memory.BChunkShared(bits=4)
// memory: packed weight chunk shared -> registers. The weight tile is pre-arranged by humming_gen.schemes.packing:
// one 16-byte shared load per plane word group gives a thread the codes of a whole 16-tile chunk (conflict-free:
// lanes read consecutive 16 B).
struct alignas(16) u32x4 {
  u32 x, y, z, w;
};

__device__ __forceinline__ void load_b_chunk(u32 (&words)[kChunkWords], const u32* b_smem_warp, int chunk) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const u32x4 v = *reinterpret_cast<const u32x4*>(b_smem_warp + ((chunk * 4 + l) * 32 + lane) * 4);
    words[4 * l + 0] = v.x;
    words[4 * l + 1] = v.y;
    words[4 * l + 2] = v.z;
    words[4 * l + 3] = v.w;
  }
}

// ---- memory.BTileCpAsync(bits=4, tile_bytes=16384)
// memory: packed weight tile (16384 bytes = kBlockN x kBlockK x 4 bits, pre-arranged by
// humming_gen.schemes.packing) global -> shared as one linear cp.async copy.
constexpr int kBTileChunks = 16384 / 16;
constexpr int kBWarpSliceWords = kBTileChunks * 4 / (cfg::kWarpsN * cfg::kWarpsK);

__device__ __forceinline__ void load_b_stage(u32* b_smem_stage, const u32x4* b_tile) {
#pragma unroll
  for (int j = 0; j < (kBTileChunks + cfg::kThreads - 1) / cfg::kThreads; ++j) {
    const int i = threadIdx.x + j * cfg::kThreads;
    if (kBTileChunks % cfg::kThreads == 0 || i < kBTileChunks) {
      cp_async_16(smem_address(b_smem_stage + i * 4), b_tile + i, 16);
    }
  }
}

// ---- memory.GroupParamsCpAsync(dtype='float16', tensors=('b_scale', 'b_zero'))
// memory: per-group b_scale and b_zero of a stage (kGroupRows rows of kBlockN float16, stored [group][n] with rows
// permuted 0,8,1,9,.. in each 16-row tile) global -> shared with cp.async.
constexpr int kGroupRowChunks = cfg::kBlockN * 2 / 16;

__device__ __forceinline__ void load_group_stage(u16* smem_stage, const u16* gmem, int n0, int row0) {
#pragma unroll
  for (int j = 0; j < (cfg::kGroupRows * kGroupRowChunks + cfg::kThreads - 1) / cfg::kThreads; ++j) {
    const int i = threadIdx.x + j * cfg::kThreads;
    if ((cfg::kGroupRows * kGroupRowChunks) % cfg::kThreads == 0 || i < cfg::kGroupRows * kGroupRowChunks) {
      const int row = i / kGroupRowChunks, chunk = i % kGroupRowChunks;
      cp_async_16(smem_address(smem_stage + row * cfg::kBlockN + chunk * 8),
                  gmem + (long long)(row0 + row) * cfg::kNPad + n0 + chunk * 8, 16);
    }
  }
}

// ---- memory.GroupParamsShared(dtype='float16', tensors=('b_scale', 'b_zero'), float_scales=True, pair_loads=True)
// memory: per-group b_scale and b_zero of a stage in shared memory (rows of kBlockN float16, permuted 0,8,1,9,.. in
// each 16-row tile) -> registers: a thread reads its (row g, row g+8)
// pair with one 4-byte load and broadcasts each half into a float16 pair.
// (row g, row g+8) values of n tile `n16` in group row `row`, each broadcast to both lanes.
__device__ __forceinline__ void load_group_pair(u32& lo, u32& hi, const u16* smem_stage, int row, int n16) {
  const u32 both = *reinterpret_cast<const u32*>(smem_stage + row * cfg::kBlockN + n16 * 16 + 2 * ((threadIdx.x % 32) / 4));
  lo = prmt(both, both, 0x1010u);
  hi = prmt(both, both, 0x3232u);
}

// (row g, row g+8) values of n tile `n16` in group row `row` as fp32, for fp32 partial sums.
__device__ __forceinline__ void load_group_f32(float& lo, float& hi, const u16* smem_stage, int row, int n16) {
  const u32 both = *reinterpret_cast<const u32*>(smem_stage + row * cfg::kBlockN + n16 * 16 + 2 * ((threadIdx.x % 32) / 4));
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }\n" : "=f"(lo), "=f"(hi) : "r"(both));
}

// ======================================== mma

// ---- mma.MmaSyncM16N8K16(dtype='float16')
// ptx: warp-wide D = A * B + D, m16n8k16, float16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{ %0, %1, %2, %3}, { %4, %5, %6, %7}, { %8, %9}, { %0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ======================================== schedule

// ---- schedule.DenseSplitKSchedule(split_k=7)
// schedule: dense tiles with split-K, so that small M still fills every SM. blockIdx.x walks n tiles (fastest:
// CTAs in flight share one activation tile in L2), blockIdx.y m tiles, blockIdx.z the kSplitK slices of the
// kKTiles k tiles (balanced to within one tile).
struct TileCoord {
  int n0, m0, kt_begin, kt_end, split, tile;
};
__device__ __forceinline__ TileCoord tile_coord() {
  const int split = blockIdx.z;
  return TileCoord{static_cast<int>(blockIdx.x) * cfg::kBlockN, static_cast<int>(blockIdx.y) * cfg::kBlockM,
                   cfg::kKTiles * split / cfg::kSplitK, cfg::kKTiles * (split + 1) / cfg::kSplitK, split,
                   static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x)};
}

// ======================================== epilogue

// ---- epilogue.WarpKReduce(warps_k=4)
// epilogue: sum the kWarpsK k-slices of the CTA tile through shared memory, in slice order (deterministic).
// Warps of slice 0 end up holding the CTA's partial sums.
constexpr int kAccPerThread = cfg::kWarpNTiles * cfg::kWarpMTiles * 4;

__device__ __forceinline__ void reduce_warps_k(float (&acc)[cfg::kWarpNTiles][cfg::kWarpMTiles][4], float* red_smem,
                                               int wk, int wmn) {
  const int lane = threadIdx.x % 32;
  if (wk > 0) {
    float* mine = red_smem + ((wk - 1) * cfg::kWarpsMN + wmn) * kAccPerThread * 32;
#pragma unroll
    for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
#pragma unroll
      for (int mt = 0; mt < cfg::kWarpMTiles; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[((nt * cfg::kWarpMTiles + mt) * 4 + i) * 32 + lane] = acc[nt][mt][i];
  }
  __syncthreads();
  if (wk == 0) {
#pragma unroll 1
    for (int s = 1; s < cfg::kWarpsK; ++s) {
      const float* theirs = red_smem + ((s - 1) * cfg::kWarpsMN + wmn) * kAccPerThread * 32;
#pragma unroll
      for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
#pragma unroll
        for (int mt = 0; mt < cfg::kWarpMTiles; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][mt][i] += theirs[((nt * cfg::kWarpMTiles + mt) * 4 + i) * 32 + lane];
    }
  }
}

// ---- epilogue.SplitKReduce(split_k=7)
// epilogue: split-K hand-off between CTAs. Every slice stores its fp32 partial tile to the workspace; the last
// slice to arrive (an arrival counter per output tile) sums all slices in slice order (deterministic, batch
// invariant) and finishes the tile, then resets the counter, so the workspace never needs clearing.
constexpr int kSplitAccPerThread = cfg::kWarpNTiles * cfg::kWarpMTiles * 4;

__device__ __forceinline__ bool split_k_reduce(float (&acc)[cfg::kWarpNTiles][cfg::kWarpMTiles][4], float* workspace,
                                               int* counters, int split, int tile, int wmn, bool holder) {
  __shared__ int is_last;
  const int lane = threadIdx.x % 32;
  float* tile_ws = workspace + static_cast<long long>(tile) * cfg::kSplitK * cfg::kWarpsMN * kSplitAccPerThread * 32;
  if (holder) {
    float* mine = tile_ws + (split * cfg::kWarpsMN + wmn) * kSplitAccPerThread * 32;
#pragma unroll
    for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
#pragma unroll
      for (int mt = 0; mt < cfg::kWarpMTiles; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[((nt * cfg::kWarpMTiles + mt) * 4 + i) * 32 + lane] = acc[nt][mt][i];
  }
  fence_gpu();  // release this thread's partial sums before the arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) is_last = arrive_and_count(counters + tile) == cfg::kSplitK - 1;
  __syncthreads();
  if (!is_last) return false;
  fence_gpu();  // acquire the other slices' partial sums
  if (holder) {
#pragma unroll
    for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
#pragma unroll
      for (int mt = 0; mt < cfg::kWarpMTiles; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][mt][i] = 0.0f;
#pragma unroll 1
    for (int s = 0; s < cfg::kSplitK; ++s) {
      const float* theirs = tile_ws + (s * cfg::kWarpsMN + wmn) * kSplitAccPerThread * 32;
#pragma unroll
      for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
#pragma unroll
        for (int mt = 0; mt < cfg::kWarpMTiles; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][mt][i] += load_cg(theirs + ((nt * cfg::kWarpMTiles + mt) * 4 + i) * 32 + lane);
    }
  }
  if (threadIdx.x == 0) reset_counter(counters + tile);
  return true;
}

// ---- epilogue.StoreOutput(dtype='float16', out_dtype='float16', out_scale=False, bias=False)
// epilogue: fp32 accumulators -> float16 output (m x n, row-major, leading dimension ldc).
// Fragment of tile (nt, mt): registers 0, 1 hold (n = g, m = 2t, 2t + 1), registers 2, 3 hold n = g + 8.
__device__ __forceinline__ void store_output(const float (&acc)[cfg::kWarpNTiles][cfg::kWarpMTiles][4], const Params& p,
                                             int n_base, int m_base) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  u16* c = static_cast<u16*>(p.c);
#pragma unroll
  for (int nt = 0; nt < cfg::kWarpNTiles; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int n = n_base + nt * 16 + g + 8 * half;
      if (n >= cfg::kN) continue;
#pragma unroll
      for (int mt = 0; mt < cfg::kWarpMTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int m = m_base + mt * 8 + 2 * t + j;
          if (m < p.m) c[static_cast<long long>(m) * p.ldc + n] = from_float(acc[nt][mt][2 * half + j]);
        }
      }
    }
  }
}

// ======================================== pipeline

// ---- pipeline.StandardPipeline(kernel_name='gemm_wuint4g128zisbfloat16_afloat16_n4096k4096_sm_80_8x128x256s3w1x2x4k7', group_params=('b_scale', 'b_zero'), hoist_group_params=True, slice_scale=True, dequant_params=('zero',), convert_in_extract=True, warp_k_reduce=True, split_k=True, min_blocks=2, pdl=False)
// pipeline: standard (cp.async multi-stage ring + ldmatrix + in-register dequantization + mma.sync).
// Weights are the mma A operand (16 n rows x 16 k), activations the B operand (16 k x 8 m), so a decode step
// with m <= 8 wastes no tensor-core rows on padding. kStages stages of {activation tile, packed weight tile
//, b_scale, b_zero} are kept in flight; each warp owns a kWarpN x kWarpM
// slice of the CTA tile and a 1/kWarpsK share of every stage's k range.
extern "C" __global__ void __launch_bounds__(cfg::kThreads, 2) gemm_wuint4g128zisbfloat16_afloat16_n4096k4096_sm_80_8x128x256s3w1x2x4k7(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const TileCoord tc = tile_coord();
  const int warp = threadIdx.x / 32;
  const int wk = warp / cfg::kWarpsMN, wmn = warp % cfg::kWarpsMN;
  const int wn = wmn % cfg::kWarpsN, wm = wmn / cfg::kWarpsN;

  // Shared-memory ring: stage s holds [a tile | b tile | b_scale | b_zero] at s * kStageBytes.
  auto a_stage = [&](int s) { return reinterpret_cast<u16*>(smem + s * cfg::kStageBytes); };
  auto b_stage = [&](int s) { return reinterpret_cast<u32*>(smem + s * cfg::kStageBytes + cfg::kAStageBytes); };
  auto b_scale_stage = [&](int s) { return reinterpret_cast<u16*>(smem + s * cfg::kStageBytes + cfg::kBScaleOffset); };
  auto b_zero_stage = [&](int s) { return reinterpret_cast<u16*>(smem + s * cfg::kStageBytes + cfg::kBZeroOffset); };
  const u32x4* b_gmem = static_cast<const u32x4*>(p.b) + static_cast<long long>(blockIdx.x) * cfg::kBStride;

  // Weights and their group parameters: written by no kernel, so they may be fetched before the wait below.
  auto load_weight_stage = [&](int s, int kt) {
    load_b_stage(b_stage(s), b_gmem + static_cast<long long>(kt) * kBTileChunks);
    load_group_stage(b_scale_stage(s), static_cast<const u16*>(p.b_scale), tc.n0, kt * cfg::kGroupRowsPerKTile / cfg::kKTilesPerGroup);
    load_group_stage(b_zero_stage(s), static_cast<const u16*>(p.b_zero), tc.n0, kt * cfg::kGroupRowsPerKTile / cfg::kKTilesPerGroup);
  };
  auto load_activation_stage = [&](int s, int kt) {
    load_a_stage(a_stage(s), static_cast<const u16*>(p.a), p.lda, p.m, cfg::kKA, tc.m0, kt * cfg::kBlockK);
  };

  float acc[cfg::kWarpNTiles][cfg::kWarpMTiles][4];
#pragma unroll
  for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
#pragma unroll
    for (int mt = 0; mt < cfg::kWarpMTiles; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nt][mt][i] = 0.0f;

  // Dequantize each 16-tile chunk of this warp's weight slice and multiply it into the accumulators.
  auto compute_stage = [&](int s) {
    const u32* b_warp = b_stage(s) + (wk * cfg::kWarpsN + wn) * kBWarpSliceWords;
    u32 a_frag[cfg::kWarpMTiles][2];
    // This warp's k slice lies inside one group: its rows' group parameters are loaded once per stage.
    const int group_row = (wk * cfg::kWarpK) / cfg::kGroupSizeInStage;
    u32 zero_lo_nt[cfg::kWarpNTiles], zero_hi_nt[cfg::kWarpNTiles];
#pragma unroll
    for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
      load_group_pair(zero_lo_nt[nt], zero_hi_nt[nt], b_zero_stage(s), group_row, wn * cfg::kWarpNTiles + nt);
    // The group scale multiplies this stage's fp32 partial sums once per row instead of every weight.
    float acc_slice[cfg::kWarpNTiles][cfg::kWarpMTiles][4];
#pragma unroll
    for (int nt = 0; nt < cfg::kWarpNTiles; ++nt)
#pragma unroll
      for (int mt = 0; mt < cfg::kWarpMTiles; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_slice[nt][mt][i] = 0.0f;
#pragma unroll
    for (int chunk = 0; chunk < cfg::kChunksPerWarp; ++chunk) {
      u32 words[kChunkWords];
      load_b_chunk(words, b_warp, chunk);
#pragma unroll
      for (int t = 0; t < 16; ++t) {
        const int tile = chunk * 16 + t;
        const int ks = tile / cfg::kWarpNTiles, nt = tile % cfg::kWarpNTiles;
        if (nt == 0) load_a_fragments(a_frag, a_stage(s), wm * cfg::kWarpM, wk * cfg::kWarpK + ks * 16);
        const u32 zero_lo = zero_lo_nt[nt], zero_hi = zero_hi_nt[nt];
        u32 b_frag[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          b_frag[r] = dequant_pair(extract_code_pair(words, 4 * t + r),
                                   r % 2 ? zero_hi : zero_lo);
        }
#pragma unroll
        for (int mt = 0; mt < cfg::kWarpMTiles; ++mt) mma_m16n8k16(acc_slice[nt][mt], b_frag, a_frag[mt]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < cfg::kWarpNTiles; ++nt) {
      float scale_g, scale_g8;  // rows g and g + 8
      load_group_f32(scale_g, scale_g8, b_scale_stage(s), group_row, wn * cfg::kWarpNTiles + nt);
#pragma unroll
      for (int mt = 0; mt < cfg::kWarpMTiles; ++mt) {
        acc[nt][mt][0] += acc_slice[nt][mt][0] * scale_g;
        acc[nt][mt][1] += acc_slice[nt][mt][1] * scale_g;
        acc[nt][mt][2] += acc_slice[nt][mt][2] * scale_g8;
        acc[nt][mt][3] += acc_slice[nt][mt][3] * scale_g8;
      }
    }
  };

  // Prologue: fill kStages - 1 stages, weights first. Every iteration commits one group (possibly empty), so
  // cp_async_wait<kStages - 2> always means "the stage about to be read has landed".
  const int iters = tc.kt_end - tc.kt_begin;
#pragma unroll
  for (int s = 0; s < cfg::kStages - 1; ++s)
    if (s < iters) load_weight_stage(s, tc.kt_begin + s);
#pragma unroll
  for (int s = 0; s < cfg::kStages - 1; ++s) {
    if (s < iters) load_activation_stage(s, tc.kt_begin + s);
    cp_async_commit();
  }
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<cfg::kStages - 2>();
    __syncthreads();  // stage `it` is visible to all warps, and every warp is done with stage it - 1
    const int next = it + cfg::kStages - 1;
    if (next < iters) {  // refills the stage read at it - 1
      load_weight_stage(next % cfg::kStages, tc.kt_begin + next);
      load_activation_stage(next % cfg::kStages, tc.kt_begin + next);
    }
    cp_async_commit();
    compute_stage(it % cfg::kStages);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is idle: its shared memory may be reused by the epilogue

  reduce_warps_k(acc, reinterpret_cast<float*>(smem), wk, wmn);
  if (!split_k_reduce(acc, static_cast<float*>(p.workspace), static_cast<int*>(p.counters), tc.split, tc.tile, wmn,
                      wk == 0))
    return;
  if (wk == 0) store_output(acc, p, tc.n0 + wn * cfg::kWarpN, tc.m0 + wm * cfg::kWarpM);
}

}  // namespace hg
