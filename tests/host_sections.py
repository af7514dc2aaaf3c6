"""Pieces of a generated kernel source for host translation units (the tests that compile a template's code with
g++ and run it against a Python model): the cfg constants, the Params struct, one component's section."""

from __future__ import annotations

import re


def cfg_namespace(src: str) -> str:
    """The `namespace hg::cfg { ... }` block of constants."""
    return re.search(r"namespace hg::cfg \{.*?\}  // namespace hg::cfg", src, re.S).group(0)


def params_struct(src: str) -> str:
    """The `struct Params { ... };` of the kernel's arguments (after the TensorMap struct its first field may be)."""
    tensor_map = re.search(r"struct alignas\(64\) TensorMap \{.*?\n\};", src, re.S)
    params = re.search(r"struct Params \{.*?\n\};", src, re.S).group(0)
    return (tensor_map.group(0) + "\n" + params) if tensor_map else params


def params_fields(params: str) -> list[str]:
    """The field names of a Params struct (each declared with its comment)."""
    return re.findall(r"\b(\w+);\s*//", params)


def epilogue_section(src: str, component: str) -> str:
    """From the `// ---- epilogue.<component>` header to the pipeline section that follows it."""
    start = src.index(f"// ---- epilogue.{component}")
    return src[start:src.index("// ======================================== pipeline", start)]
