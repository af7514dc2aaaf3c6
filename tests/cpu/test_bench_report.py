"""The benchmark command without a GPU: argument parsing, the table, the JSON schema, the plot (where matplotlib is
installed) and the progress line, on synthetic results; `humming-gen tune --dry-run` lists candidates."""

from __future__ import annotations

import io
import json

import pytest

from humming_gen.bench import ms_argument, parse_formats, parse_ms, parse_shapes
from humming_gen.bench.report import (SCHEMA, Progress, add_rates, check_results, device_limits, format_table,
                                      plot_results, write_json)
from humming_gen.cli import main


def synthetic() -> dict:
    rows = []
    for m in (1, 16, 64):
        rows.append(add_rates({"impl": "cublas-bf16", "format": None, "shape": "4096x4096", "n": 4096, "k": 4096,
                               "m": m, "layers": 8, "graph_us": 12.0 + m / 10, "bytes": 4096 * 4096 * 2}))
        rows.append(add_rates({"impl": "humming_gen", "format": "w4a16-int4-g128", "shape": "4096x4096", "n": 4096,
                               "k": 4096, "m": m, "layers": 16, "graph_us": 8.0 + m / 8, "rel_err": 2e-3,
                               "bytes": 4096 * 4096 // 2}))
    rows.append({"impl": "humming", "format": "w4a16-int4-g128", "shape": "4096x4096", "n": 4096, "k": 4096, "m": 1,
                 "layers": 16, "graph_us": None, "error": "RuntimeError: no config"})
    return {"schema": SCHEMA, "gpu": "NVIDIA H200", "limits": device_limits("NVIDIA H200"), "ms": [1, 16, 64],
            "replays": 20, "rows": rows}


def test_parse_errors_name_the_option_and_value():
    assert parse_ms("--m", "1,16") == [1, 16] and parse_shapes("--shapes", "14336x4096") == [(14336, 4096)]
    with pytest.raises(ValueError, match=r"--m: 'a' is not an integer"):
        parse_ms("--m", "1,a")
    with pytest.raises(ValueError, match=r"--m: M = 0; allowed: positive"):
        parse_ms("--m", "0")
    with pytest.raises(ValueError, match=r"--shapes: '4096' is not NxK"):
        parse_shapes("--shapes", "4096")
    with pytest.raises(ValueError, match=r"--formats: unknown format 'int4'; allowed: .*w4a16-int4-g128"):
        parse_formats("--formats", "int4")


def test_ms_argument_is_a_usage_error_naming_the_option(capsys):
    """The bench scripts' positional M lists: argparse reports parse_ms's message and exits 2, no traceback."""
    import argparse

    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("ms", nargs="?", default="1,16", type=ms_argument("ms"))
    assert parser.parse_args([]).ms == [1, 16] and parser.parse_args(["4096"]).ms == [4096]
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["1,x"])
    assert e.value.code == 2 and "argument ms: ms: 'x' is not an integer" in capsys.readouterr().err


def test_table_has_a_column_per_implementation():
    table = format_table(synthetic())
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| M |"))
    assert header == "| M | cublas-bf16 | humming_gen w4a16-int4-g128 | humming w4a16-int4-g128 |"
    assert "| 1 | 12.1 | 8.1 | err |" in lines and "| 16 | 13.6 | 10.0 | - |" in lines
    assert "humming_gen w4a16-int4-g128 2.0e-03" in table and "4245 GB/s" in table


def test_cublaslt_fp8_is_one_column_per_shape_for_fp8_activation_formats():
    """Issue 10's table reads our 8-bit times (quantization included) against cuBLASLt fp8 on pre-quantized inputs:
    a per-shape baseline beside cuBLAS bf16, timed when a format quantizes activations to fp8, not for others."""
    from humming_gen.bench.run import fp8_baseline_wanted

    results = synthetic()
    for m in (1, 16, 64):
        results["rows"].insert(0, add_rates({"impl": "cublaslt-fp8", "format": None, "shape": "4096x4096", "n": 4096,
                                             "k": 4096, "m": m, "layers": 8, "graph_us": 20.0 + m,
                                             "bytes": 4096 * 4096}))
    check_results(results)
    lines = format_table(results).splitlines()
    header = next(line for line in lines if line.startswith("| M |"))
    assert header == "| M | cublaslt-fp8 | cublas-bf16 | humming_gen w4a16-int4-g128 | humming w4a16-int4-g128 |"
    assert "| 1 | 21.0 | 12.1 | 8.1 | err |" in lines
    assert fp8_baseline_wanted(["w4a16-int4-g128", "w8a8-fp8-channel"]) and fp8_baseline_wanted(["w4a8-mxfp4-fp8"])
    assert not fp8_baseline_wanted(["w4a16-int4-g128", "w8a8-int8-channel"])


def test_rates_and_limits():
    row = add_rates({"m": 64, "n": 4096, "k": 4096, "graph_us": 10.0, "bytes": 8_000_000})
    assert row["gbps"] == pytest.approx(800.0) and row["tflops"] == pytest.approx(2 * 64 * 4096 * 4096 / 1e7)
    assert device_limits("NVIDIA H200")["memory_gbps"] == 4245.0 and device_limits("NVIDIA A10") is None


def test_json_schema(tmp_path):
    results = synthetic()
    path = write_json(results, tmp_path / "out" / "bench.json")
    assert json.loads(path.read_text())["schema"] == SCHEMA
    broken = dict(results, rows=[{"impl": "x"}])
    with pytest.raises(ValueError, match=r"rows\[0\] lacks \['format', 'shape'"):
        check_results(broken)
    with pytest.raises(ValueError, match="'limits' must be a dict"):
        check_results(dict(results, limits=None))


def test_plot_on_synthetic_results(tmp_path):
    pytest.importorskip("matplotlib")
    (path,) = plot_results(synthetic(), tmp_path / "bench")
    assert path.name == "bench-w4a16-int4-g128-4096x4096.png" and path.read_bytes()[:4] == b"\x89PNG"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_uses_carriage_returns_only_on_a_terminal():
    log = io.StringIO()
    p = Progress(2, log)
    p.step("a")
    p.step("b")
    p.close()
    assert "\r" not in log.getvalue() and log.getvalue().count("\n") == 2 and "[2/2] b" in log.getvalue()
    tty = _Tty()
    p = Progress(2, tty)
    p.step("a")
    p.close()
    assert tty.getvalue().startswith("\r") and tty.getvalue().endswith("\n")


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv,fragment", [
    (["bench", "--shapes", "4096"], "--shapes: '4096' is not NxK"),
    (["bench", "--formats", "w4a16"], "--formats: unknown format 'w4a16'"),
    (["bench", "--m", "1,,2"], "--m: '' is not an integer"),
    (["bench", "--layers", "0"], "--layers 0"),
    (["tune", "--n", "4096", "--k", "4096", "--m", "x"], "--m: 'x' is not an integer"),
    (["tune", "--k", "4096"], "--n is required"),
])
def test_cli_errors(capsys, argv, fragment):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and fragment in err and err.count("\n") == 1


def test_cli_tune_dry_run_lists_candidates(capsys):
    rc, out, _ = _run(capsys, "tune", "--n", "4096", "--k", "4096", "--m", "1,16,300", "--dry-run")
    assert rc == 0
    assert "bucket M <= 8:" in out and "bucket M <= 16:" in out and "bucket M <= 512:" in out
    assert "pipeline=warp_specialized" in out and "pipeline=standard" in out


def test_cli_bench_and_tune_need_a_gpu(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, _, err = _run(capsys, "bench", "--m", "1")
    assert rc == 2 and "needs a CUDA GPU" in err
    rc, _, err = _run(capsys, "tune", "--n", "256", "--k", "256", "--m", "1")
    assert rc == 2 and "torch.cuda.is_available() is False" in err
