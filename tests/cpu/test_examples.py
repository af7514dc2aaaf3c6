"""The examples run (their CPU path) and print what they promise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script, expected", [
    ("quickstart.py", "generated gemm_wint4g128"),
    ("custom_format.py", "w5a16-u5-g128-zp: gemm_wu5g128zi"),
    ("convert_checkpoint.py", "model.mlp.down_proj"),
    ("quantize_model.py", "linear layers quantized"),
    ("tensor_parallel.py", "built the kernels of 2 MLP and 2 MoE shards"),
    ("moe.py", "buckets for sm_90a; run this on a GPU"),
])
def test_example_runs(script, expected, tmp_path):
    """The examples write where users can find them (the system temp dir): here that is inside tmp_path."""
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HUMMING_GEN_CACHE_DIR": str(tmp_path / "cache"),
           "TMPDIR": str(systmp)}
    result = subprocess.run([sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True,
                            env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout, result.stdout[-2000:]
    if script == "quickstart.py":
        assert [p.suffix for p in systmp.iterdir()] == [".cu"]  # the saved kernel, where TMPDIR points
