"""Read a kernel's resources from the cubin itself, for when the ptxas report is missing.

NVRTC 13.0 (the wheel that torch 2.11+cu130 pulls in) returns an empty program log for most
compiles even with ``--ptxas-options=-v`` (seen on an H200 machine: only the first compile of a
process reported, sometimes), so the log cannot be the only source. A cubin is an ELF file whose
``.nv.info`` section carries per-function attributes (the ones ``cuobjdump -elf`` prints):
EIATTR_REGCOUNT and EIATTR_FRAME_SIZE, keyed by symbol index; a kernel's static shared memory is
the size of its ``.nv.shared.<kernel>`` section. Spill counts are not recorded there.

The format is NVIDIA's and not formally documented, so everything here is defensive: anything
unexpected yields ``None`` rather than an exception, and the CPU tests check these figures
against ptxas's own report for every target.
"""

from __future__ import annotations

import struct

_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_SHT_SYMTAB = 2
_STT_FUNC = 2

#: Shared memory the hardware reserves per block from sm_90 on. Those cubins carry a
#: ``.nv.shared.reserved.0`` section and count the reserve inside each kernel's shared section,
#: while ptxas and the driver report the kernel's own arrays only.
_RESERVED_SMEM_BYTES = 1024


def _sections(data: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, offset, size, link) of each section of a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = raw[shstrndx][4]
    out = []
    for name, typ, _flags, _addr, offset, size, link, _info, _align, _entsize in raw:
        start = names_offset + name
        out.append((data[start:data.index(b"\0", start)].decode(), typ, offset, size, link))
    return out


def _function_symbols(data: bytes, sections: list[tuple[str, int, int, int, int]]) -> dict[str, int]:
    """Name -> symbol-table index of every function symbol."""
    symtab = next(s for s in sections if s[1] == _SHT_SYMTAB)
    strtab_offset = sections[symtab[4]][2]
    out = {}
    for index in range(symtab[3] // 24):
        name, info, _other, _shndx, _value, _size = struct.unpack_from("<IBBHQQ", data, symtab[2] + 24 * index)
        if info & 0xF == _STT_FUNC:
            start = strtab_offset + name
            out[data[start:data.index(b"\0", start)].decode()] = index
    return out


def _info_attributes(blob: bytes) -> list[tuple[int, bytes]]:
    """(attribute, payload) pairs of an ``.nv.info`` section; stops at a format it does not know."""
    out, pos = [], 0
    while pos + 2 <= len(blob):
        fmt, attr = blob[pos], blob[pos + 1]
        pos += 2
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", blob, pos)
            out.append((attr, blob[pos + 2 : pos + 2 + size]))
            pos += 2 + size
        elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):  # records are 4-byte aligned
            out.append((attr, blob[pos : pos + 2]))
            pos += 2
        else:
            break
    return out


def entry_functions(cubin: bytes) -> set[str] | None:
    """Names of the functions in the cubin (None if it cannot be read)."""
    try:
        return set(_function_symbols(cubin, _sections(cubin)))
    except Exception:
        return None


def cubin_resources(cubin: bytes, kernel_name: str) -> dict[str, int] | None:
    """``registers``, ``shared_bytes`` and ``stack_bytes`` of one kernel, read from the cubin.

    Returns None when the cubin cannot be read or holds no such function.
    """
    try:
        sections = _sections(cubin)
        symbol = _function_symbols(cubin, sections).get(kernel_name)
        if symbol is None:
            return None
        by_name = {s[0]: s for s in sections}
        info = by_name.get(".nv.info")
        if info is None:
            return None
        resources: dict[str, int] = {}
        for attr, payload in _info_attributes(cubin[info[2] : info[2] + info[3]]):
            if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(payload) == 8:
                index, value = struct.unpack("<II", payload)
                if index == symbol:
                    resources["registers" if attr == _EIATTR_REGCOUNT else "stack_bytes"] = value
        if "registers" not in resources:
            return None
        shared = by_name.get(f".nv.shared.{kernel_name}")
        shared_bytes = shared[3] if shared is not None else 0
        if shared is not None and ".nv.shared.reserved.0" in by_name:
            shared_bytes = max(shared_bytes - _RESERVED_SMEM_BYTES, 0)
        resources["shared_bytes"] = shared_bytes
        resources.setdefault("stack_bytes", 0)
        return resources
    except Exception:  # malformed or unfamiliar ELF: no figures rather than a failed compile
        return None
