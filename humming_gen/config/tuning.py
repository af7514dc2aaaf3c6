"""`TuningConfig`: how fast a kernel runs (tiles, warps, stages, pipeline, MMA, load paths, split-K).

A TuningConfig never changes a result beyond the order of float rounding. It is checked here for internal
consistency only; whether a target has the instructions it names is checked when a kernel is composed
(`Target.require`), because the same TuningConfig is valid on several targets.
"""

from __future__ import annotations

import attrs

from humming_gen.config.validate import JsonConfig, check_bool, check_choice, check_int, raise_reasons

PIPELINES = ("standard", "warp_specialized", "umma")

# Spelled as in `Target.mma_shapes`. The m16n8k* / m8n8k* names are mma.sync shapes; "wgmma" and "tcgen05"
# are the Hopper / Blackwell asynchronous MMAs (their shape follows from the tile); "ppu_m16n16k16" is the
# Zhenwu PPU variant. m16n8k8, m8n8k16 and m8n8k32 are the only fp16 / int8 / int4 shapes Turing (sm_75) has.
MMAS = ("m16n8k16", "m16n8k32", "m16n8k64", "wgmma", "tcgen05", "ppu_m16n16k16", "m16n8k8", "m8n8k16", "m8n8k32")

# K depth of each fixed-shape MMA: a warp's K tile must hold whole instructions.
MMA_K = {"m16n8k8": 8, "m16n8k16": 16, "m16n8k32": 32, "m16n8k64": 64, "m8n8k16": 16, "m8n8k32": 32,
         "ppu_m16n16k16": 16}

# Which pipeline skeletons can drive which MMA; an MMA not listed runs in "standard" or "warp_specialized".
MMA_PIPELINES = {"wgmma": ("warp_specialized",), "tcgen05": ("umma",), "ppu_m16n16k16": ("standard",)}
MMA_SYNC_PIPELINES = ("standard", "warp_specialized")

LOADS = ("cp_async", "tma", "tma_multicast")
# a_load only: the standard pipeline's 8-bit-activation kernels read the 16-bit activations and quantize them per
# token in their loader (no separate quantize kernel; pipelines.standard.compose_a8)
A_LOADS = LOADS + ("quantize",)
# a_load values of the 8-bit warp-specialized kernels that read activation codes in the panels layout
# (quantize_activation(layout="panels")): one bulk copy per stage, or half of it multicast into a cluster pair
PANEL_LOADS = ("tma", "tma_multicast")
TMA_PIPELINES = ("warp_specialized", "umma")  # TMA completes on an mbarrier a producer warp waits for
# Where the MMA reads the weights from: "registers" (mma.sync, and wgmma's register A operand: each warp loads its
# fragments), or "shared" (wgmma's shared-memory A operand through a descriptor: the 8-bit warp-specialized kernels
# of pipelines.warp_specialized.compose_a8, whose weights are packed in wgmma's canonical layout, BLayoutSw128), or
# "widened" (weights of at most 4 bits, packed as for registers, widened to 8-bit codes by the producer warpgroup's
# other warps into a BLayoutSw128 panel of each stage, which wgmma then reads as with "shared")
B_OPERANDS = ("registers", "shared", "widened")
# Which wgmma dimension the tokens take: "n" (swap-AB: weights on M, 64 rows a warpgroup, tokens on N, 8..256 of
# them, so small M pads nothing), or "m" (tokens the shared-memory A operand, 64 a warpgroup, and the weights on N:
# the 8-bit shared-weight kernels at large M, whose per-token scales are then two rows a thread instead of one per
# token column, and whose per-column scales are the weights')
TOKENS_ON = ("n", "m")
RASTERS = ("n_major", "m_major", "m_band")  # m_band: persistent grids walk bands of BAND_M m tiles m-fastest
BAND_M = 8
MAX_WARPS = 16
# Every pipeline keeps a ring of `stages` shared-memory buffers: while the MMA loop computes on one stage, the
# copies of the next ones are in flight, and `cp.async.wait_group stages - 2` waits for the oldest. With one
# stage the loop would compute on a buffer whose copy has not landed (and wait_group would get -1).
MIN_STAGES = 2
MAX_STAGES = 8
# split_k becomes gridDim.z, and the generated schedule computes `kKTiles * split / kSplitK` in 32-bit ints:
# kKTiles <= MAX_K / 16 = 2^21 (config/layer.py), so split_k <= 2^9 keeps that product below 2^30.
MAX_SPLIT_K = 512


@attrs.frozen(kw_only=True, hash=False)
class TuningConfig(JsonConfig):
    """Tile shape, pipeline and load paths of one kernel.

    block_m x block_n x block_k is the CTA tile; warps_m x warps_n x warps_k warps split it evenly into warp
    tiles of (block_m / warps_m) x (block_n / warps_n) x (block_k / warps_k). warps_k > 1 reduces partial
    sums across warps inside the CTA; split_k > 1 across CTAs. Cluster multicast: CTAs of one cluster row
    (same m, cluster_n > 1) share the A tile, CTAs of one column (cluster_m > 1) share the B tile.
    """

    pipeline: str = "standard"
    mma: str = "m16n8k16"
    block_m: int = 16
    block_n: int = 128
    block_k: int = 128
    warps_m: int = 1
    warps_n: int = 4
    warps_k: int = 1
    stages: int = 4
    a_load: str = "cp_async"
    b_load: str = "cp_async"
    scale_load: str = "cp_async"
    ctas_per_sm: int = 1
    split_k: int = 1
    stream_k: bool = False
    raster: str = "n_major"
    cluster_m: int = 1
    cluster_n: int = 1
    b_operand: str = attrs.field(default="registers", metadata={"listed_when_set": True})
    tokens_on: str = attrs.field(default="n", metadata={"listed_when_set": True})
    _key_cache: str | None = attrs.field(init=False, default=None, eq=False, repr=False)

    __hash__ = JsonConfig.__hash__

    def __attrs_post_init__(self) -> None:
        o = "TuningConfig"
        check_choice(o, "pipeline", self.pipeline, PIPELINES)
        check_choice(o, "mma", self.mma, MMAS)
        check_int(o, "block_m", self.block_m, lo=8, hi=256, multiple_of=8)
        check_int(o, "block_n", self.block_n, lo=16, hi=512, multiple_of=16)
        check_int(o, "block_k", self.block_k, lo=16, hi=1024, multiple_of=16)
        for name in ("warps_m", "warps_n", "warps_k"):
            check_int(o, name, getattr(self, name), lo=1, hi=MAX_WARPS)
        check_int(o, "stages", self.stages, lo=MIN_STAGES, hi=MAX_STAGES,
                  why="the cp.async ring computes on one stage while the next is copied, so it needs at least 2")
        for name in ("a_load", "b_load", "scale_load"):
            check_choice(o, name, getattr(self, name), A_LOADS if name == "a_load" else LOADS)
        check_int(o, "ctas_per_sm", self.ctas_per_sm, lo=1, hi=4)
        check_int(o, "split_k", self.split_k, lo=1, hi=MAX_SPLIT_K,
                  why="k slices; the schedule's 32-bit tile arithmetic holds up to 512")
        check_bool(o, "stream_k", self.stream_k)
        check_choice(o, "raster", self.raster, RASTERS)
        check_int(o, "cluster_m", self.cluster_m, lo=1, hi=4)
        check_int(o, "cluster_n", self.cluster_n, lo=1, hi=4)
        check_choice(o, "b_operand", self.b_operand, B_OPERANDS)
        check_choice(o, "tokens_on", self.tokens_on, TOKENS_ON)
        raise_reasons(o, self._consistency_reasons())

    def _consistency_reasons(self) -> list[str]:
        """Cross-field rules, each reason naming the fields involved."""
        reasons = []
        if self.num_warps > MAX_WARPS:
            reasons.append(f"warps_m*warps_n*warps_k = {self.num_warps} warps; allowed: 1..{MAX_WARPS}")
        for dim, block, warps, mult in (("m", self.block_m, self.warps_m, 8), ("n", self.block_n, self.warps_n, 16),
                                        ("k", self.block_k, self.warps_k, 16)):
            if block % warps or (block // warps) % mult:
                reasons.append(f"block_{dim}={block} / warps_{dim}={warps} must be a whole warp tile that is a "
                               f"multiple of {mult}")
        mma_k = MMA_K.get(self.mma)
        if mma_k is not None and self.block_k % self.warps_k == 0 and (self.block_k // self.warps_k) % mma_k:
            reasons.append(f"warp tile k = block_k/warps_k = {self.block_k // self.warps_k} is not a multiple of "
                           f"the K depth {mma_k} of mma={self.mma!r}")
        pipelines = MMA_PIPELINES.get(self.mma, MMA_SYNC_PIPELINES)
        if self.pipeline not in pipelines:
            reasons.append(f"mma={self.mma!r} needs pipeline in {pipelines}, got pipeline={self.pipeline!r}")
        for name in ("a_load", "b_load", "scale_load"):
            if getattr(self, name) not in ("cp_async", "quantize") and self.pipeline not in TMA_PIPELINES:
                reasons.append(f"{name}={getattr(self, name)!r} needs pipeline in {TMA_PIPELINES}, "
                               f"got pipeline={self.pipeline!r}")
        if self.a_load == "quantize" and self.pipeline != "standard":
            reasons.append(f"a_load='quantize' (activations quantized in the loader) needs pipeline='standard', "
                           f"got pipeline={self.pipeline!r}")
        if self.a_load == "tma_multicast" and self.cluster_n == 1:
            reasons.append("a_load='tma_multicast' needs cluster_n > 1 (the CTAs sharing an A tile)")
        if self.b_load == "tma_multicast" and self.cluster_m == 1:
            reasons.append("b_load='tma_multicast' needs cluster_m > 1 (the CTAs sharing a B tile)")
        if self.scale_load == "tma_multicast" and self.cluster_m * self.cluster_n == 1:
            reasons.append("scale_load='tma_multicast' needs a cluster of more than one CTA")
        if self.b_operand != "registers" and self.mma != "wgmma":
            reasons.append(f"b_operand={self.b_operand!r} (weights read by the MMA from shared memory) needs "
                           f"mma='wgmma', got mma={self.mma!r}")
        if self.tokens_on == "m" and self.b_operand == "registers":
            reasons.append(f"tokens_on='m' (tokens as wgmma's shared-memory A operand) needs b_operand='shared' or "
                           f"'widened' (the weights then the B operand, also from shared memory), got "
                           f"b_operand={self.b_operand!r}")
        if self.stream_k and self.split_k > 1:
            reasons.append(f"stream_k=True and split_k={self.split_k} are mutually exclusive")
        return reasons

    @property
    def num_warps(self) -> int:
        return self.warps_m * self.warps_n * self.warps_k

    @property
    def threads(self) -> int:
        """Threads per CTA (32 per warp)."""
        return 32 * self.num_warps

    @property
    def warp_tile(self) -> tuple[int, int, int]:
        """(m, n, k) tile of one warp."""
        return (self.block_m // self.warps_m, self.block_n // self.warps_n, self.block_k // self.warps_k)

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    def summary(self) -> str:
        """One line for the generated source's header; holds every field."""
        return (f"tuning  pipeline={self.pipeline} mma={self.mma} "
                f"block={self.block_m}x{self.block_n}x{self.block_k} "
                f"warps={self.warps_m}x{self.warps_n}x{self.warps_k} stages={self.stages} split_k={self.split_k} "
                f"stream_k={'yes' if self.stream_k else 'no'} "
                f"load=a:{self.a_load},b:{self.b_load},scale:{self.scale_load} ctas_per_sm={self.ctas_per_sm} "
                f"raster={self.raster} cluster={self.cluster_m}x{self.cluster_n}"
                + (f" b_operand={self.b_operand}" if self.b_operand != "registers" else "")
                + (f" tokens_on={self.tokens_on}" if self.tokens_on != "n" else ""))
