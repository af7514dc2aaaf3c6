"""Sources, compilation and launch state of the standalone kernel families (activation quantization, MoE routing, the
MoE top-k reduction): a header template, the used `cfg::` constants, the `Params` struct and each component's
template, like the GEMMs' sources; `compile_source` and `StandaloneKernel` what every family's kernel object
shares."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from typing import Any, Sequence

class StandaloneConfig:
    """What every standalone family's config shares: the cache key (a hash of `to_dict()`) and the kernel name
    made of its readable parts and that key."""

    __slots__ = ()

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def named(self, readable: str) -> str:
        """`readable` as a C identifier, then 8 characters of the key (configs that read alike stay apart)."""
        return re.sub(r"[^A-Za-z0-9_]", "_", readable) + "_" + self.key()[:8]


CTYPE_FORMAT = {"const void*": "Q", "void*": "Q", "unsigned char*": "Q", "const float*": "Q", "float*": "Q",
                "int*": "Q", "const int*": "Q", "long long": "q", "int": "i"}


def params_struct(fields: Sequence[tuple[str, str, str]]) -> struct.Struct:
    """struct.Struct packing (name, C type, comment) fields with C alignment (8-byte fields aligned, tail padded)."""
    fmt, size = "<", 0
    for _, ctype, _ in fields:
        code = CTYPE_FORMAT[ctype]
        width = struct.calcsize(code)
        pad = (-size) % width
        fmt += "x" * pad + code
        size += pad + width
    return struct.Struct(fmt + "x" * ((-size) % 8))


def render_source(cfg: Any, header_template: str, version: str, components: Sequence[Any],
                  constants: Sequence[tuple], fields: Sequence[tuple[str, str, str]], compiler: str | None) -> str:
    """The complete .cu of one standalone kernel (deterministic): header with the config, the constants the body
    reads, Params, then the components by family."""
    from humming_gen.codegen.render import environment
    from humming_gen.runtime import compiler_version
    from humming_gen.runtime.compile import resolve_compiler, resolve_options

    name = resolve_compiler(compiler)
    try:
        compiler_line = compiler_version(name)
        options = " ".join(resolve_options(cfg.target.arch, name))
    except Exception:  # no compiler for this arch here: the source is still generated
        compiler_line, options = name, "(not compiled here)"
    env = environment()
    header = env.get_template(header_template).render(
        version=version, kernel_name=cfg.kernel_name, key=cfg.key(), summary=cfg.summary(), target=cfg.target.name,
        compiler=compiler_line, options=options, components=[c.describe() for c in components],
        config_json=json.dumps(cfg.to_dict(), sort_keys=True))
    parts = ["\nnamespace hg {\n"]
    family = None
    for c in components:
        if c.family != family:
            family = c.family
            parts.append(f"\n// ======================================== {family}\n")
        parts.append(f"\n// ---- {c.describe()}\n{env.get_template(c.template).render(**c.context())}")
    parts.append("\n}  // namespace hg\n")
    body = "".join(parts)
    used = [c for c in constants if re.search(rf"cfg::{c[0]}\b", body)]
    return "".join([header, env.get_template("constants.cuh.j2").render(constants=used),
                    env.get_template("params.cuh.j2").render(fields=fields), body])


def compile_source(cfg: Any, source: str, compiler: str | None) -> Any:
    """Compile a family's generated source (memory and disk cache of humming_gen.runtime)."""
    from humming_gen.runtime import compile_cached
    from humming_gen.runtime.compile import resolve_compiler

    return compile_cached(source, cfg.kernel_name, cfg.target.arch, compiler=resolve_compiler(compiler))


class StandaloneKernel:
    """A compiled standalone kernel of config `cfg` (kernel_name, target, pdl): loaded on first use per device and
    dynamic shared-memory size; `pack` fills its Params from a dict of every field's value. Each family adds its
    `launch` (grid, block, shared memory)."""

    def __init__(self, cfg: Any, source: str, compiled: Any, fields: Sequence[tuple[str, str, str]]):
        self.config, self.source, self.compiled = cfg, source, compiled
        self.name = cfg.kernel_name
        self.struct = params_struct(fields)
        self.fields = [f[0] for f in fields]
        self._functions: dict[tuple[int, int], Any] = {}
        self._pdl = cfg.pdl

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"

    def function(self, device: int, smem: int = 0) -> Any:
        """The kernel loaded on `device` with `smem` bytes of dynamic shared memory (loaded once: no import or
        lookup beyond the dict on the launch path)."""
        fn = self._functions.get((device, smem))
        if fn is None:
            from humming_gen import runtime

            fn = self._functions[(device, smem)] = runtime.load(self.compiled, smem)
        return fn

    def pack(self, values: dict[str, int]) -> bytes:
        return self.struct.pack(*map(values.__getitem__, self.fields))

