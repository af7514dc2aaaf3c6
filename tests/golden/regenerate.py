"""Regenerate the golden kernel sources in this folder with the `humming-gen emit` CLI.

    python tests/golden/regenerate.py          # rewrite every golden .cu
    python tests/golden/regenerate.py --check  # exit 1 and list the files the generator no longer reproduces

A golden file changes only when the generator's output changes: review its diff like any code change.
tests/cpu/test_golden.py checks that the current generator reproduces them. The one line recording the local
toolchain (`// target ... compiler <name version> options <flags>`) is masked when comparing, since it names
the NVRTC version and the debug switches of the machine that renders it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# file name -> `humming-gen emit` arguments (every kernel is tuned by the heuristic bucket of --m)
GOLDEN: dict[str, list[str]] = {
    # W4A16 int4 g128 prefill kernel of the H200: warp-specialized pipeline (bulk copies + cp.async producer,
    # two consumer warpgroups, wgmma m64n128k16 with register A, persistent grid, PDL)
    "w4a16-int4-g128-bf16-n4096k4096-m1024-sm_90a-ws.cu": [
        "--n", "4096", "--k", "4096", "--scheme", "w4a16-int4-g128", "--target", "sm_90a", "--m", "1024"],
    # W4A16 int4 g128 decode kernel of the H200 (split-K, warps_k=4, scales on fp32 partial sums, PDL)
    "w4a16-int4-g128-bf16-n4096k4096-m1-sm_90a.cu": [
        "--n", "4096", "--k", "4096", "--scheme", "w4a16-int4-g128", "--target", "sm_90a", "--m", "1"],
    # asymmetric uint4 with integer zero points, fp16 activations, on Ampere (no PDL)
    "w4a16-uint4-g128-zp-fp16-n4096k4096-m1-sm_80.cu": [
        "--n", "4096", "--k", "4096", "--scheme", "w4a16-int4-g128-zp", "--dtype", "float16", "--target", "sm_80",
        "--m", "1"],
    # OCP MXFP4: float4e2m1 codes with e8m0 scales per 32
    "w4a16-mxfp4-bf16-n4096k4096-m1-sm_90a.cu": [
        "--n", "4096", "--k", "4096", "--scheme", "w4a16-mxfp4", "--target", "sm_90a", "--m", "1"],
}

_TOOLCHAIN = re.compile(r"^(// target\s+\S+\s+compiler ).*$", re.M)


def mask_toolchain(source: str) -> str:
    """The source with the local compiler version and options replaced by a placeholder."""
    return _TOOLCHAIN.sub(r"\1<toolchain>", source, count=1)


def emit(name: str, out: Path) -> Path:
    """Write golden kernel `name` to `out` through the CLI (NVRTC named as the compiler, as by default)."""
    from humming_gen.cli import main

    with contextlib.redirect_stdout(io.StringIO()):  # the CLI's "wrote <path>" line
        code = main(["emit", *GOLDEN[name], "--compiler", "nvrtc", "-o", str(out)])
    if code != 0:
        raise RuntimeError(f"humming-gen emit failed for {name} (exit code {code})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name in GOLDEN:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                fresh = emit(name, Path(tmp) / name).read_text()
            path = HERE / name
            if not path.exists() or mask_toolchain(path.read_text()) != mask_toolchain(fresh):
                stale.append(name)
        else:
            print(f"wrote {emit(name, HERE / name).relative_to(HERE.parent.parent)}")
    if stale:
        print("stale golden files (run tests/golden/regenerate.py and review the diff):\n  " + "\n  ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
