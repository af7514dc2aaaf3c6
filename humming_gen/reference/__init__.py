"""float64 references that tests and examples check kernels against."""

from humming_gen.reference.gemm import reference_gemm, reference_moe

__all__ = ["reference_gemm", "reference_moe"]
