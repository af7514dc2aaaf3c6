"""Largest shapes the generated kernels can index, derived from their 32-bit integer arithmetic.

The generated source holds shapes as `constexpr int` constants and computes tile coordinates, k offsets and
the kernel parameters m, lda and ldc in `int`; the products that can outgrow 32 bits (row * row stride,
n block * packed-weight stride, group row * padded N) are computed in `long long`. So what must stay below
2^31 is each dimension and the largest single constant:

- kBStride, the 16-byte chunks of packed weight per n block, is K_pad * block_n * bits / 128. With the
  largest tile (block_n = 512) and 8-bit codes that is 32 * K_pad: K <= 2^25 keeps it at or below 2^30.
- the split-K schedule computes kKTiles * split / kSplitK: kKTiles <= K / 16 = 2^21 and split_k <= 512
  (config/tuning.py) keep it at or below 2^30.
- N_pad (N rounded up to block_n <= 512), n offsets and ldc: N <= 2^30 leaves them below 2^31.
- m and lda are `int` parameters: at most 2^31 - 1 rows, and K (the activation row length) <= 2^25.

Group and block sizes are bounded by the dimension they divide: a group longer than the largest K is the same
as one scale per row, and its constants (kGroupSize, kKTilesPerGroup) must fit an int as well.
tests/cpu/test_config.py composes kernels at these bounds and checks every generated constant.
"""

MAX_K = 1 << 25
MAX_N = 1 << 30
MAX_M = (1 << 31) - 1
