// humming_gen 0.1.0 - generated; edit templates/, not this file
// kernel  gemm_wint4g128sbfloat16_abfloat16_n4096k4096_sm_90a_128x256x128s4w1x8x1k1_ws   key 0cd1530a1247
// layer   n=4096 k=4096 weight=int4 scale=bfloat16/g128 zero_point=no act=16-bit dtype=bfloat16 out=bfloat16 bias=no
// compute gemm=dense batch_invariant=no accum=float32 input_scale=row_major epilogue=[]
// tuning  pipeline=warp_specialized mma=wgmma block=128x256x128 warps=1x8x1 stages=4 split_k=1 stream_k=no load=a:tma,b:tma,scale:tma ctas_per_sm=1 raster=n_major cluster=1x1
// target  sm_90a   compiler nvrtc 13.0   options -arch=sm_90a --std=c++17 -default-device --ptxas-options=-O3 --ptxas-options=-v -DNDEBUG
// components (in order):
//   ptx.SmemAddress()
//   ptx.Stmatrix(x1=False, x2=True)
//   ptx.Prmt()
//   ptx.AndOr()
//   ptx.Fma2(dtype='bfloat16')
//   ptx.CvtScalar(dtype='bfloat16', out_dtype='bfloat16', to_float=False)
//   ptx.GridDependency()
//   ptx.Mbarrier(cp_async=False)
//   ptx.BulkCopy()
//   ptx.TensorCopy()
//   ptx.SetMaxNReg()
//   numeric.PlaneExtract(bits=4, or_bits='0x43004300')
//   numeric.SubtractOffsetScale(dtype='bfloat16', offset=136.0)
//   memory.ATileTma(dtype='bfloat16')
//   memory.BChunkShared(bits=4)
//   memory.WeightStageBulk(group_params=('b_scale',))
//   memory.GroupParamsShared(dtype='bfloat16', tensors=('b_scale',), float_scales=False, pair_loads=True)
//   mma.WgmmaRS(dtype='bfloat16', n=128)
//   schedule.PersistentSchedule(split_k=1)
//   epilogue.StoreOutputStaged(dtype='bfloat16', out_dtype='bfloat16', out_scale=False, bias=False, atom=wgmma.m64nNk16 (one warp's rows))
//   pipeline.WarpSpecializedPipeline(kernel_name='gemm_wint4g128sbfloat16_abfloat16_n4096k4096_sm_90a_128x256x128s4w1x8x1k1_ws', block_m=128, consumer_warpgroups=2, group_params=('b_scale',), hoist_group_params=True, dequant_params=('scale',), convert_in_extract=True, split_k=False, pdl=True, a_tma=True, staged_store=True)
// full configs (JSON):
//   layer   {"dtype": "bfloat16", "has_bias": false, "k": 4096, "n": 4096, "num_experts": 1, "out_dtype": "bfloat16", "scheme": {"activation": null, "block_size": null, "global_scale": false, "granularity": "group", "group_size": 128, "scale_dtype": "bfloat16", "scale_rule": "rceil", "weight": "int4", "zero_point": null, "zero_point_dtype": null}, "top_k": 1}
//   compute {"accumulate": "float32", "batch_invariant": false, "epilogue_activation": null, "gemm": "dense", "input_scale_layout": "row_major", "topk_weight": false}
//   tuning  {"a_load": "tma", "b_load": "tma", "block_k": 128, "block_m": 128, "block_n": 256, "cluster_m": 1, "cluster_n": 1, "ctas_per_sm": 1, "mma": "wgmma", "pipeline": "warp_specialized", "raster": "n_major", "scale_load": "tma", "split_k": 1, "stages": 4, "stream_k": false, "warps_k": 1, "warps_m": 1, "warps_n": 8}

typedef unsigned int u32;
typedef unsigned short u16;

// Tile geometry and problem constants (every config value appears once, here).
namespace hg::cfg {
constexpr int kN = 4096;  // output features
constexpr int kNPad = 4096;  // N padded to the weight layout's block_n
constexpr int kBlockM = 128;  // tokens per tile (wgmma N)
constexpr int kBlockN = 256;  // weight rows per tile
constexpr int kBlockK = 128;
constexpr int kNTiles = 16;  // tiles along N
constexpr int kKTiles = 32;  // k tiles of kBlockK
constexpr int kStages = 4;  // ring depth
constexpr int kStepsPerStage = 8;  // k16 wgmma steps per stage
constexpr int kThreads = 384;  // one producer and the consumer warpgroups
constexpr int kConsumerThreads = 256;
constexpr int kProducerRegisters = 40;  // setmaxnreg budgets
constexpr int kConsumerRegisters = 232;
constexpr int kWarpNTiles = 2;  // n tiles of its slice per consumer warp = m64 wgmma instructions per warpgroup and step
constexpr int kWarpMTiles = 16;  // 8-token accumulator groups
constexpr int kBSliceBytes = 4096;  // one 128-row layout block x 64 k of packed weight
constexpr int kBWarpSliceWords = 512;  // one 64-row warp slice of it, in words
constexpr int kSlicesPerStage = 2;
constexpr int kSlicesPerN = 64;  // 64-k slices per layout block of the packed weight
constexpr int kSmemAlign = 1024;
constexpr int kGroupRows = 1;  // group-parameter rows per stage
constexpr int kGroupRowsPerKTile = 1;
constexpr int kKTilesPerGroup = 1;
constexpr int kAStageBytes = 32768;
constexpr int kStageBytes = 50176;
constexpr int kStagingBytes = 2048;  // a consumer warp's epilogue staging
constexpr int kBScaleOffset = 49152;  // b_scale rows in a stage
}  // namespace hg::cfg

// A TMA tensor map (cuTensorMapEncodeTiled's 128 opaque bytes): read by cp.async.bulk.tensor from the kernel's
// parameter space, so the kernel takes Params as __grid_constant__.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

// Kernel argument: one struct passed by value, packed by humming_gen.kernel.Kernel.launch in this field order.
struct Params {
  TensorMap a_map;  // TMA map of a: (m, k) bfloat16, 128-byte swizzle
  const void* a;  // activations (m, k) bfloat16, row stride lda
  const void* b;  // packed weights (humming_gen.schemes.packing)
  const void* b_scale;  // group scales [group][n_pad] bfloat16
  void* c;  // output (m, n) bfloat16, row stride ldc
  int m;  // rows of a and c
  int lda;  // row stride of a, elements
  int ldc;  // row stride of c, elements
};
// (no offsetof: NVRTC 13.0 rejects it here) the map is the first field, so the next starts at byte 128
static_assert(sizeof(TensorMap) == 128 && alignof(Params) == 64,
              "the launcher packs the map's 128 bytes first and the struct to a multiple of 64 bytes");

namespace hg {

// ======================================== ptx

// ---- ptx.SmemAddress()
// ptx: generic -> shared-window address, the operand form cp.async and ldmatrix take.
__device__ __forceinline__ u32 smem_address(const void* p) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
  return addr;
}

// ---- ptx.Stmatrix(x1=False, x2=True)
// ptx: 8x8 b16 matrices from mma C fragments into shared memory, transposed (sm_90+). Register i of lane (g, t)
// holds row g, columns 2t and 2t + 1 of matrix i; lane 8i + j gives the address of row j of the stored matrix,
// which is column j of matrix i (16 bytes, its rows 0..7 in order).
__device__ __forceinline__ void stmatrix_x2_trans(u32 addr, u32 r0, u32 r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], { %1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
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

// ---- ptx.Fma2(dtype='bfloat16')
// ptx: packed bfloat16 pair a * b + c, rounded to nearest (the only packed bfloat16 op on every target).
__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// ---- ptx.CvtScalar(dtype='bfloat16', out_dtype='bfloat16', to_float=False)
// ptx: single fp32 <-> 16-bit conversions for the epilogue.
__device__ __forceinline__ u16 from_float(float x) {
  u16 d;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(d) : "f"(x));
  return d;
}

// ---- ptx.GridDependency()
// ptx: programmatic dependent launch. The kernel may start while the previous one in the stream finishes: it
// prefetches weights (which no kernel writes), then waits for the previous grid before touching activations.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// ---- ptx.Mbarrier(cp_async=False)
// ptx: mbarrier (shared-memory transaction barriers) of the producer -> consumer ring. A full barrier completes
// when its expected arrivals and transaction bytes are in; a wait spins on the parity of the phase it awaits.
__device__ __forceinline__ void mbarrier_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(u32 bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "mbarrier_wait_retry:\n"  // a label local to this { } block, so each inlined copy has its own
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra mbarrier_wait_retry;\n"
      "}\n" ::"r"(bar), "r"(parity) : "memory");
}

// ---- ptx.BulkCopy()
// ptx: bulk global -> shared copy on the copy engine (no descriptor: a contiguous run of bytes, a multiple of 16),
// completing as transaction bytes on an mbarrier.
__device__ __forceinline__ void bulk_copy(u32 smem_dst, const void* gmem_src, int bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_dst), "l"(gmem_src), "r"(bytes), "r"(bar) : "memory");
}

// ---- ptx.TensorCopy()
// ptx: TMA tile copy global -> shared through a tensor map (in the kernel's parameter space: a __grid_constant__
// Params field), completing as transaction bytes on an mbarrier; and the map's prefetch into the TMA unit's cache.
__device__ __forceinline__ void tensor_copy_2d(u32 smem_dst, const void* map, int x, int y, u32 bar) {

  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
               ::"r"(smem_dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// ---- ptx.SetMaxNReg()
// ptx: per-warpgroup register budgets: the producer gives registers back, the consumers take them.
template <int kRegs>
__device__ __forceinline__ void registers_decrease() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs)); }
template <int kRegs>
__device__ __forceinline__ void registers_increase() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs)); }

// ======================================== numeric

// ---- numeric.PlaneExtract(bits=4, or_bits='0x43004300')
// numeric: 4-bit code pairs from 1 bit plane(s) of widths 4
// (layout of humming_gen.schemes.packing): register `reg` of a 16-tile chunk lands with its two codes in the
// low bits of each 16-bit lane, OR-ed into 0x43004300. `reg` is a compile-time constant after unrolling, so
// words[] stays in registers and every shift below is one instruction (or none).
constexpr int kChunkWords = 16;
constexpr u32 kOrBits = 0x43004300u;
__device__ __forceinline__ u32 extract_code_pair(const u32 (&words)[kChunkWords], int reg) {
  const u32 plane0 = words[0 + reg / 4] >> (reg % 4 * 4);
  u32 pair = and_or(plane0, 0x000F000Fu, kOrBits);
  return pair;
}

// ---- numeric.SubtractOffsetScale(dtype='bfloat16', offset=136.0)
// numeric: value = (x - offset) * group scale.
// x is the converted pair; scale a (bfloat16, bfloat16) pair for the fragment's row.
__device__ __forceinline__ u32 dequant_pair(u32 x, u32 scale) {
  return fma2(fma2(x, 0x3F803F80u, 0xC308C308u), scale, 0x80008000u);
}

// ======================================== memory

// ---- memory.ATileTma(dtype='bfloat16')
// memory: activation tile (kBlockM tokens x kBlockK bfloat16) global -> shared by TMA, issued by the producer's
// first thread: one 2-D copy of 64 k x kBlockM rows per panel through the tensor map p.a_map (encoded per call by
// the launcher, humming_gen.runtime.tensor_map), whose 128-byte swizzle is wgmma's K-major layout (16-byte chunk c
// of row r at chunk c ^ (r % 8)). Rows >= m and columns >= k arrive as zeros; the whole box counts on the full
// barrier either way.
constexpr int kAPanelBytes = cfg::kBlockM * 128;
constexpr int kAPanels = cfg::kBlockK / 64;
constexpr int kAStageTxBytes = kAPanels * kAPanelBytes;
static_assert(cfg::kBlockM % 8 == 0 && cfg::kBlockM <= 256, "a box of whole 8-row swizzle atoms, at most 256 rows");
static_assert(kAStageTxBytes == cfg::kAStageBytes, "the boxes fill the stage's activation tile exactly");

// k tile kt of the tile at row m0.
__device__ __forceinline__ void load_a_stage(u32 a_smem_stage, const TensorMap& map, int m0, int kt, u32 full) {
#pragma unroll
  for (int panel = 0; panel < kAPanels; ++panel)
    tensor_copy_2d(a_smem_stage + panel * kAPanelBytes, &map, kt * cfg::kBlockK + panel * 64, m0, full);
}

// Shared-memory matrix descriptor: start address, leading offset 16 B (unused with this swizzle), 1024 B between
// 8-row groups, 128-byte swizzle.
__device__ __forceinline__ unsigned long long smem_descriptor(u32 addr) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// Descriptor of k16 step `step` of the stage: panel step / 4, 32 bytes further per step inside the panel.
__device__ __forceinline__ unsigned long long a_step_descriptor(u32 a_smem_stage, int step) {
  return smem_descriptor(a_smem_stage + (step / 4) * kAPanelBytes + (step % 4) * 32);
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

// ---- memory.WeightStageBulk(group_params=('b_scale',))
// memory: a stage's packed weights and b_scale rows global -> shared by one producer thread
// with bulk copies. The weight layout (humming_gen.schemes.packing, 128-row layout blocks of 64-k slices) keeps
// the kSlicesPerStage slices of one layout block contiguous: one copy per layout block of the tile. Blocks past
// kNPad (the last tile of a layer whose N is not a multiple of kBlockN) are not copied: their warps dequantize
// whatever the stage held before, which stays in accumulator rows that no store reads (store_output masks n >= kN,
// and each warp's split-K workspace rows are its own).
constexpr int kLayoutBlocks = cfg::kBlockN / 128;

__device__ __forceinline__ int valid_layout_blocks(int n0) { return min(kLayoutBlocks, (cfg::kNPad - n0) / 128); }

// Transaction bytes of one stage of the tile at n0.
__device__ __forceinline__ int weight_stage_bytes(int n0) {
  const int blocks = valid_layout_blocks(n0);
  return blocks * cfg::kSlicesPerStage * cfg::kBSliceBytes + 1 * cfg::kGroupRows * blocks * 128 * 2;
}

__device__ __forceinline__ void load_weight_stage(u32 smem_stage, const Params& p, int n0, int kt, u32 full) {
  const int blocks = valid_layout_blocks(n0);
  const char* b = static_cast<const char*>(p.b);
  for (int i = 0; i < blocks; ++i) {
    const long long slice = (long long)(n0 / 128 + i) * cfg::kSlicesPerN + kt * cfg::kSlicesPerStage;
    bulk_copy(smem_stage + cfg::kAStageBytes + i * cfg::kSlicesPerStage * cfg::kBSliceBytes,
              b + slice * cfg::kBSliceBytes, cfg::kSlicesPerStage * cfg::kBSliceBytes, full);
  }
  for (int r = 0; r < cfg::kGroupRows; ++r) {
    const u16* rows = static_cast<const u16*>(p.b_scale) + (long long)(kt * cfg::kGroupRowsPerKTile / cfg::kKTilesPerGroup + r) * cfg::kNPad + n0;
    bulk_copy(smem_stage + cfg::kBScaleOffset + r * cfg::kBlockN * 2, rows, blocks * 128 * 2, full);
  }
}

// ---- memory.GroupParamsShared(dtype='bfloat16', tensors=('b_scale',), float_scales=False, pair_loads=True)
// memory: per-group b_scale of a stage in shared memory (rows of kBlockN bfloat16, permuted 0,8,1,9,.. in
// each 16-row tile) -> registers: a thread reads its (row g, row g+8)
// pair with one 4-byte load and broadcasts each half into a bfloat16 pair.
// (row g, row g+8) values of n tile `n16` in group row `row`, each broadcast to both lanes.
__device__ __forceinline__ void load_group_pair(u32& lo, u32& hi, const u16* smem_stage, int row, int n16) {
  const u32 both = *reinterpret_cast<const u32*>(smem_stage + row * cfg::kBlockN + n16 * 16 + 2 * ((threadIdx.x % 32) / 4));
  lo = prmt(both, both, 0x1010u);
  hi = prmt(both, both, 0x3232u);
}

// ======================================== mma

// ---- mma.WgmmaRS(dtype='bfloat16', n=128)
// mma: warpgroup MMA m64n128k16, bfloat16 inputs, fp32 accumulators. A (64 weight rows x 16 k) comes from
// registers: warp w of the warpgroup holds rows 16w..16w+15 as an mma.sync m16n8k16 A fragment. B (16 k x
// 128 tokens) is read from shared memory through a descriptor (K-major, 128-byte swizzle). The accumulator of
// warp w: d[j][0..1] = (row 16w + g, tokens 8j + 2t, +1), d[j][2..3] = row 16w + g + 8; g = lane / 4, t = lane % 4.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory"); }

// Keeps the compiler from moving accumulator reads and writes across the asynchronous MMA.
__device__ __forceinline__ void fence_accumulators(float (&d)[cfg::kWarpMTiles][4]) {
#pragma unroll
  for (int j = 0; j < cfg::kWarpMTiles; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
}

// d (+)= A * B; accumulate = 0 starts from zero.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[cfg::kWarpMTiles][4], const u32 (&a)[4],
                                                   unsigned long long b_desc, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

// ======================================== schedule

// ---- schedule.PersistentSchedule(split_k=1)
// schedule: persistent grid. Each CTA walks units blockIdx.x, blockIdx.x + gridDim.x, ... of the problem; a unit
// is an output tile. Tiles go n-fastest, so the CTAs in flight share activation rows
// in L2 while the weights (read by every m tile) stay there.
struct TileCoord {
  int n0, m0, kt_begin, kt_end;
};
__device__ __forceinline__ int unit_count(int m) {
  return cfg::kNTiles * ((m + cfg::kBlockM - 1) / cfg::kBlockM);
}
__device__ __forceinline__ TileCoord unit_coord(int unit) {
  return TileCoord{unit % cfg::kNTiles * cfg::kBlockN, unit / cfg::kNTiles * cfg::kBlockM, 0, cfg::kKTiles};
}

// ======================================== epilogue

// ---- epilogue.StoreOutputStaged(dtype='bfloat16', out_dtype='bfloat16', out_scale=False, bias=False, atom=wgmma.m64nNk16 (one warp's rows))
// epilogue: fp32 accumulators -> bfloat16 output (m x n, row-major, leading dimension ldc).
// Fragment of tile (nt, mt): registers 0, 1 hold (n = g, m = 2t, 2t + 1), registers 2, 3 hold n = g + 8.
// Staged through shared memory: a warp converts kChunkTiles 8-token m tiles of its accumulators at a time, and
// stmatrix.trans lays them in its staging buffer as token rows of kPieces 16-byte pieces, each 8 consecutive
// columns of c; the lanes then store whole pieces, one 16-byte store per 8 values (a warp's pieces of a row are
// consecutive, so its 32-byte sectors are whole where the row spans two pieces or more and c is 16-byte aligned;
// scalar stores where c or ldc is not 16-byte aligned, or a piece runs past the last column). Piece q of staged
// row r lies in slot q ^ (r / (8 / kPieces) % kPieces) of the row, so the 8 rows of a matrix fall in distinct banks.
__device__ __forceinline__ void store_output(const float (&acc)[cfg::kWarpNTiles][cfg::kWarpMTiles][4], const Params& p,
                                             int n_base, int m_base, u32 staging) {
  constexpr int kPieces = 2 * cfg::kWarpNTiles;  // 16-byte pieces per staged row
  static_assert(kPieces == 1 || kPieces == 2 || kPieces == 4 || kPieces == 8, "a staged row has 1, 2, 4 or 8 pieces");
  // m tiles per chunk: as many as the staging holds, fewer beside more accumulators (whose registers the chunk's
  // rows and factors would spill), at most the tile's
  constexpr int kStagedTiles = cfg::kStagingBytes / (8 * kPieces * 16);
  constexpr int kRowChunk = cfg::kWarpNTiles * cfg::kWarpMTiles * 4 <= 64 ? 8 : 4;
  constexpr int kChunkLimit = kRowChunk < kStagedTiles ? kRowChunk : kStagedTiles;
  constexpr int kChunkTiles = cfg::kWarpMTiles < kChunkLimit ? cfg::kWarpMTiles : kChunkLimit;
  constexpr int kPiecesPerLane = (kChunkTiles * 8 * kPieces + 31) / 32;
  constexpr int kCols = cfg::kN;  // columns of c
  const int lane = threadIdx.x % 32;
  u16* c = static_cast<u16*>(p.c);
  const int col_base = n_base;  // the warp's first column of c
  const bool vector = reinterpret_cast<unsigned long long>(c) % 16 == 0 && p.ldc % 8 == 0;
  auto slot = [](int r, int q) { return (r * kPieces + (q ^ (r / (8 / kPieces) % kPieces))) * 16; };
  auto pack = [](float lo, float hi) { return static_cast<u32>(from_float(lo)) | static_cast<u32>(from_float(hi)) << 16; };
#pragma unroll
  for (int mt0 = 0; mt0 < cfg::kWarpMTiles; mt0 += kChunkTiles) {
    int out_rows[kPiecesPerLane];  // the row of c of each piece this lane stores, p.m for none
#pragma unroll
    for (int i = 0; i < kPiecesPerLane; ++i) {
      const int staged_row = (lane + 32 * i) / kPieces;
      const bool staged = staged_row < kChunkTiles * 8 && mt0 + staged_row / 8 < cfg::kWarpMTiles;
      const int m = m_base + mt0 * 8 + staged_row;
      out_rows[i] = staged && m < p.m ? m : p.m;
    }
    __syncwarp();  // the previous chunk's pieces are read
#pragma unroll
    for (int mc = 0; mc < kChunkTiles; ++mc) {
      const int mt = mt0 + mc;
      if (mt >= cfg::kWarpMTiles) break;
#pragma unroll
      for (int nt = 0; nt < cfg::kWarpNTiles; ++nt) {
        // rows g (half 0) and g + 8 (half 1) of n tile nt, tokens 2t, 2t + 1: pieces 2 nt and 2 nt + 1
        const u32 lo = pack(acc[nt][mt][0],
                            acc[nt][mt][1]);
        const u32 hi = pack(acc[nt][mt][2],
                            acc[nt][mt][3]);
        stmatrix_x2_trans(staging + slot(mc * 8 + lane % 8, 2 * nt + lane / 8 % 2), lo, hi);
      }
    }
    __syncwarp();  // the chunk is staged
#pragma unroll
    for (int i = 0; i < kPiecesPerLane; ++i) {
      if (out_rows[i] >= p.m) continue;
      const int piece = lane + 32 * i, staged_row = piece / kPieces, q = piece % kPieces, col = col_base + q * 8;
      uint4 v;  // (volatile: after the stmatrix stores and the __syncwarp)
      asm volatile("ld.shared.v4.b32 { %0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(staging + slot(staged_row, q)));
      u16* dst = c + static_cast<long long>(out_rows[i]) * p.ldc + col;
      if (vector && col + 8 <= kCols) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (col + e < kCols) dst[e] = static_cast<u16>(words[e / 2] >> (16 * (e % 2)));
      }
    }
  }
}

// ======================================== pipeline

// ---- pipeline.WarpSpecializedPipeline(kernel_name='gemm_wint4g128sbfloat16_abfloat16_n4096k4096_sm_90a_128x256x128s4w1x8x1k1_ws', block_m=128, consumer_warpgroups=2, group_params=('b_scale',), hoist_group_params=True, dequant_params=('scale',), convert_in_extract=True, split_k=False, pdl=True, a_tma=True, staged_store=True)
// pipeline: warp-specialized (sm_90a). Warpgroup 0 produces: one thread bulk-copies the packed weights and
// their b_scale rows, and the activation tile by TMA; a full mbarrier per
// stage completes when both have landed. Consumer warpgroup kWg (0-based; warpgroup kWg + 1 of the CTA) multiplies n tiles
// [kWg, kWg + 1) x kWarpNTiles of every 64-row warp slice: its warp w dequantizes those tiles of slice w in registers
// (the standard pipeline's layout and numeric components) and feeds each as the register A operand of one
// wgmma m64n128k16, the tokens on N (swap-AB). Dequantization of k16 step s + 1 overlaps the wgmmas of step s
// (wgmma.wait_group 1); every consumer thread releases a stage through its empty mbarrier once the wgmmas reading
// it have retired. The grid is persistent and the ring's (stage, phase) runs on across units, so the producer fills
// the next unit's stages while the consumers finish a tile.
struct Ring {
  u32 smem, full_bars, empty_bars;
  unsigned char* smem_ptr;
  __device__ __forceinline__ u32 stage(int s) const { return smem + s * cfg::kStageBytes; }
  __device__ __forceinline__ const unsigned char* stage_ptr(int s) const { return smem_ptr + s * cfg::kStageBytes; }
};

__device__ __forceinline__ void produce(const Params& p, const Ring& ring, int units) {
  int stage = 0, phase = 0;
  if (threadIdx.x == 0) prefetch_tensor_map(&p.a_map);
  bool waited = false;
#pragma unroll 1
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const TileCoord tc = unit_coord(unit);
#pragma unroll 1
    for (int kt = tc.kt_begin; kt < tc.kt_end; ++kt) {
      mbarrier_wait(ring.empty_bars + 8 * stage, phase ^ 1);
      const u32 full = ring.full_bars + 8 * stage;
      if (threadIdx.x == 0) {  // weights are written by no kernel: fetched before the wait for the previous grid
        mbarrier_arrive_expect_tx(full, weight_stage_bytes(tc.n0) + kAStageTxBytes);
        load_weight_stage(ring.stage(stage), p, tc.n0, kt, full);
      }
      if (!waited) {
        wait_for_previous_grid();  // activations may come from the previous kernel
        waited = true;
      }
      if (threadIdx.x == 0) load_a_stage(ring.stage(stage), p.a_map, tc.m0, kt, full);
      if (++stage == cfg::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
  allow_next_grid();  // the next kernel may start its weight prefetch once SMs free up
}

// Consumer warpgroup kWg: n tiles kWg * kWarpNTiles .. + kWarpNTiles of every warp slice (a compile-time choice, so
// each warpgroup runs its own copy of the loop and every register index stays static).
template <int kWg>
__device__ __forceinline__ void consume(const Params& p, const Ring& ring, int units) {
  constexpr int kTile0 = kWg * cfg::kWarpNTiles;
  static_assert(cfg::kStepsPerStage % 2 == 0, "frag[] alternates per k16 step: a stage's first step uses buffer 0");
  const int w = (threadIdx.x / 32) % 4;
  // Warp w reads 64-row slice w of the tile: layout block w / 2, slice warp w % 2 (humming_gen.schemes.packing).
  const int b_warp_word = (w / 2) * cfg::kSlicesPerStage * (cfg::kBSliceBytes / 4) + (w % 2) * cfg::kBWarpSliceWords;
  float acc[cfg::kWarpNTiles][cfg::kWarpMTiles][4];
  u32 frag[2][cfg::kWarpNTiles][4];  // double buffer: step s + 1 is dequantized while step s multiplies
  u32 words[kChunkWords];
  int stage = 0, phase = 0;
  u32 scale_lo[cfg::kWarpNTiles], scale_hi[cfg::kWarpNTiles];

  // Codes of 64-k chunk `slice` of the stage -> registers (the chunk's offset is in the pointer; load_b_chunk's own
  // chunk index stays 0).
  auto load_words = [&](int s, int slice) {
    load_b_chunk(words, reinterpret_cast<const u32*>(ring.stage_ptr(s) + cfg::kAStageBytes) + b_warp_word +
                            slice * (cfg::kBSliceBytes / 4), 0);
  };
  auto b_scale_stage = [&](int s) { return reinterpret_cast<const u16*>(ring.stage_ptr(s) + cfg::kBScaleOffset); };
  // The stage lies inside one group: its rows' group parameters are read once per stage.
  auto load_stage_params = [&](int s) {
#pragma unroll
    for (int i = 0; i < cfg::kWarpNTiles; ++i) {
      load_group_pair(scale_lo[i], scale_hi[i], b_scale_stage(s), 0, w * 4 + kTile0 + i);
    }
  };
  // Dequantize k16 step `step` (of the chunk held in `words`) into frag[buf]: chunk tile (step % 4, n tile) is
  // the mma.sync A fragment of rows 16 n .. 16 n + 15 of the warp's slice, which is also warp w's part of the
  // m64 wgmma A operand.
  auto dequantize = [&](int buf, int s, int step) {
#pragma unroll
    for (int i = 0; i < cfg::kWarpNTiles; ++i) {
      const u32 scale_lo_i = scale_lo[i], scale_hi_i = scale_hi[i];
      const int tile = (step % 4) * 4 + kTile0 + i;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        frag[buf][i][r] = dequant_pair(extract_code_pair(words, 4 * tile + r),
                                       r % 2 ? scale_hi_i : scale_lo_i);
      }
    }
  };
  // Every consumer thread arrives once its reads of the stage are done (its wgmmas retired, its words and group
  // parameters in registers). A lane-0 arrival after __syncwarp is as correct but invisible to racecheck, and was no
  // faster (H200, both variants in one run: 35.5 / 208.8 / 897.7 us at M = 128 / 1024 / 4096 against 36.0 / 207.4 /
  // 877.1).
  auto release = [&](int s) { mbarrier_arrive(ring.empty_bars + 8 * s); };
  auto wait_stage = [&](int s, int ph) {
    mbarrier_wait(ring.full_bars + 8 * s, ph);
  };

#pragma unroll 1
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const TileCoord tc = unit_coord(unit);
    const int iters = tc.kt_end - tc.kt_begin;
    wait_stage(stage, phase);
    load_words(stage, 0);
    load_stage_params(stage);
    dequantize(0, stage, 0);
    int previous = stage;
#pragma unroll 1
    for (int it = 0; it < iters; ++it) {
      const u32 a_stage = ring.stage(stage);
#pragma unroll
      for (int step = 0; step < cfg::kStepsPerStage; ++step) {
        const int buf = step % 2;
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < cfg::kWarpNTiles; ++i)
          wgmma_m64n128k16(acc[i], frag[buf][i], a_step_descriptor(a_stage, step), it > 0 || step > 0);
        wgmma_commit();
        wgmma_wait<1>();  // the wgmmas of the previous step have retired: its buffer and stage may be reused
        if (step == 0 && it > 0) release(previous);
        if (step + 1 < cfg::kStepsPerStage) {
          if ((step + 1) % 4 == 0) load_words(stage, (step + 1) / 4);
          dequantize(buf ^ 1, stage, step + 1);
        } else if (it + 1 < iters) {
          const int next = stage + 1 == cfg::kStages ? 0 : stage + 1;
          wait_stage(next, next == 0 ? phase ^ 1 : phase);
          load_words(next, 0);
          load_stage_params(next);
          dequantize(0, next, 0);
        }
      }
      previous = stage;
      if (++stage == cfg::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < cfg::kWarpNTiles; ++i) fence_accumulators(acc[i]);
    release(previous);

    store_output(acc, p, tc.n0 + w * 64 + kTile0 * 16, tc.m0, ring.smem + cfg::kStages * (cfg::kStageBytes + 16) + (kWg * 4 + w) * cfg::kStagingBytes);
  }
}

// (__grid_constant__: p stays in parameter space, where the TMA reads its tensor map)
extern "C" __global__ void __launch_bounds__(cfg::kThreads, 1) gemm_wint4g128sbfloat16_abfloat16_n4096k4096_sm_90a_128x256x128s4w1x8x1k1_ws(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // 128-byte swizzled operands need 1024-byte alignment; the launch asks for kSmemAlign spare bytes.
  Ring ring;
  ring.smem = (smem_address(smem_raw) + cfg::kSmemAlign - 1) & ~(cfg::kSmemAlign - 1);
  ring.smem_ptr = smem_raw + (ring.smem - smem_address(smem_raw));
  ring.full_bars = ring.smem + cfg::kStages * cfg::kStageBytes;
  ring.empty_bars = ring.full_bars + cfg::kStages * 8;
  const int units = unit_count(p.m);

  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < cfg::kStages; ++s) {
      mbarrier_init(ring.full_bars + 8 * s, 1);  // the first producer thread's expect_tx (bulk copies only)
      mbarrier_init(ring.empty_bars + 8 * s, cfg::kConsumerThreads);     // every consumer thread
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    registers_decrease<cfg::kProducerRegisters>();
    produce(p, ring, units);
    return;
  }
  registers_increase<cfg::kConsumerRegisters>();
  if (warpgroup == 1)
    consume<0>(p, ring, units);
  else
    consume<1>(p, ring, units);
}

}  // namespace hg
