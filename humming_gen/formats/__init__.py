"""Numeric element formats (`DType`) and their name registry."""

from humming_gen.formats.dtype import DType, FloatType, IntType
from humming_gen.formats.registry import (dtype_from_dict, dtype_from_name as dtype, format_spec, register_dtype,
                                          torch_dtype_of)

__all__ = ["DType", "FloatType", "IntType", "dtype", "dtype_from_dict", "format_spec", "register_dtype",
           "torch_dtype_of"]
