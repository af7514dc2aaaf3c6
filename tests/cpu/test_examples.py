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


def test_convert_checkpoint_without_safetensors_says_how_to_install(tmp_path):
    """Without safetensors (simulated: sys.modules['safetensors'] = None) the converter example names the missing
    package and its pip command in one message, exits non-zero and prints no traceback."""
    script = ROOT / "examples" / "convert_checkpoint.py"
    code = ("import runpy, sys\n"
            "sys.modules['safetensors'] = sys.modules['safetensors.torch'] = None\n"
            f"sys.argv = [{str(script)!r}]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HUMMING_GEN_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                            cwd=tmp_path)
    assert result.returncode != 0, result.stdout[-2000:]
    assert "safetensors" in result.stderr and "pip install safetensors" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
