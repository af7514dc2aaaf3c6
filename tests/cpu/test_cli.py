"""The humming-gen command: errors in one line naming the option, custom formats, replayable headers, presets
that say whether they generate, a --help that does not import torch, --version, the layer `tune` times (fold), the
kernels `inspect` describes (the compute-type fallback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from humming_gen import __version__
from humming_gen.cli import main

REPO = Path(__file__).resolve().parents[2]
E2M2 = {"kind": "float", "name": "e2m2", "exponent_bits": 2, "mantissa_bits": 2}
CUSTOM_SCHEME = json.dumps({"weight": E2M2, "group_size": 64, "scale_dtype": "float8e8m0"})


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv,fragments", [
    (["--scheme-json", "not json"], ["--scheme-json: not valid JSON", "'not json'"]),
    (["--scheme-json", "[1, 2]"], ["--scheme-json: expected a JSON object, got a JSON list"]),
    (["--scheme-json", '{"weight": "e2m2"}'], ["--scheme-json: QuantScheme.weight: unknown dtype 'e2m2'",
                                               "'kind': 'float'"]),
    (["--scheme-json", '{"weight": "int4", "colour": 1}'], ["--scheme-json:", "colour"]),
    (["--scheme", "w4a16-nope"], ["--scheme: unknown preset 'w4a16-nope'"]),
    (["--tuning", "{"], ["--tuning: not valid JSON"]),
    (["--tuning", '{"block_m": 16, "block_n": 128, "block_k": 128, "warps_n": 2, "warps_k": 2, "stages": 1}'],
     ["--tuning: TuningConfig.stages: got 1", "at least 2"]),
    (["-o", "/nonexistent/dir/x.cu"], ["-o/--output: cannot write '/nonexistent/dir/x.cu'", "No such file"]),
    (["--m", "0"], ["--m 0: the rows the kernel is tuned for must be at least 1"]),
])
def test_emit_errors_are_one_line_naming_the_option(capsys, argv, fragments):
    rc, out, err = _run(capsys, "emit", "--n", "4096", "--k", "4096", *argv)
    assert rc == 2 and out == ""
    assert err.startswith("humming-gen: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_emit_without_shape_names_the_options(capsys):
    rc, _, err = _run(capsys, "emit")
    assert rc == 2 and "--n and --k are required (or --layer-json)" in err


def test_emit_custom_format_and_replay_its_header(capsys, tmp_path):
    """A custom format given in full emits a kernel; the header's layer JSON replays it byte for byte."""
    first = tmp_path / "first.cu"
    rc, _, _ = _run(capsys, "emit", "--n", "256", "--k", "512", "--scheme-json", CUSTOM_SCHEME, "-o", str(first))
    assert rc == 0
    source = first.read_text()
    assert "weight=e2m2" in source
    layer_line = next(line for line in source.splitlines() if line.startswith("//   layer   "))
    layer_json = layer_line[len("//   layer   "):]
    assert json.loads(layer_json)["scheme"]["weight"] == {**E2M2, "signed": True, "bias": 1, "nan": "none",
                                                          "subnormals": True}
    rc, out, _ = _run(capsys, "emit", "--layer-json", layer_json)
    assert rc == 0 and out == source


def test_layer_json_excludes_shape_options(capsys):
    rc, _, err = _run(capsys, "emit", "--layer-json", "{}", "--n", "4")
    assert rc == 2 and "leave out --n" in err
    rc, _, err = _run(capsys, "emit", "--layer-json", "nope")
    assert rc == 2 and "--layer-json: not valid JSON" in err and err.count("\n") == 1


def test_presets_say_which_cannot_be_generated(capsys):
    rc, out, _ = _run(capsys, "presets")
    assert rc == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("w")}
    assert " yes " in lines["w4a16-int4-g128"]
    assert " yes " in lines["w8a8-fp8-channel"] and " as bfloat16 " in lines["w4a4-nvfp4"]
    assert "quantized activations" in out


def test_presets_name_the_fallback_of_an_emulated_mma(capsys):
    """int4 x int4 composes on sm_90a, but ptxas emulates its MMA there and QuantLinear, tune and inspect run int8
    activations: presets says so (on sm_80, with int4 tensor cores, the scheme's own kernel runs)."""
    for target, status in (("sm_90a", " as int8 "), ("sm_80", " yes ")):
        rc, out, _ = _run(capsys, "presets", "--target", target)
        assert rc == 0
        lines = out.splitlines()
        i = next(i for i, line in enumerate(lines) if line.startswith("w4a4-int4-g128 "))
        assert status in lines[i], lines[i]
        if target == "sm_90a":
            assert "ptxas emulates" in lines[i + 1], lines[i + 1]


def test_help_does_not_import_torch_and_version():
    code = ("import sys\nfrom humming_gen.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert "usage: humming-gen" in result.stdout and f"humming-gen {__version__}" in result.stdout
    assert result.stdout.strip().endswith("NO-TORCH")


def test_sm75_bf16_does_not_suggest_a_refused_combination(capsys):
    rc, _, err = _run(capsys, "emit", "--n", "4096", "--k", "4096", "--target", "sm_75")
    assert rc == 2
    if "use float16" in err:
        rc16, _, _ = _run(capsys, "emit", "--n", "4096", "--k", "4096", "--target", "sm_75", "--dtype", "float16")
        assert rc16 == 0, "the error suggested float16 activations, which are refused as well"


@pytest.mark.parametrize("scheme,target,option,folds", [
    ("w4a8-mxfp4-fp8", "sm_90a", [], True),  # warp-specialized kernels read folded scales
    ("w4a8-mxfp4-fp8", "sm_89", [], False),  # no warp-specialized kernel there
    ("w4a8-mxfp4-fp8", "sm_90a", ["--fold-scales", "no"], False),
    ("w4a8-mxfp4-fp8", "sm_89", ["--fold-scales", "yes"], True),
    ("w4a8-mxfp4-fp8", "sm_90a", ["--fold-scales", "auto"], True),
    ("w4a16-mxfp4", "sm_90a", [], False),  # 16-bit activations: nothing to fold into
])
def test_tune_fold_scales(capsys, scheme, target, option, folds):
    """By default tune times the layer a QuantLinear builds (whose stored winners it looks up): folded on sm_90a,
    not on sm_89, as tests/cpu/test_tuning.py finds QuantLinear decide for this layer."""
    rc, out, err = _run(capsys, "tune", "--n", "256", "--k", "1024", "--scheme", scheme, "--target", target,
                        "--m", "4096", "--dry-run", *option)
    assert rc == 0, err
    assert ("fold_scales=yes" in out.splitlines()[0]) == folds


@pytest.mark.parametrize("argv,fragments", [
    (["--n", "256", "--k", "1024", "--scheme", "w4a16-int4-g128", "--fold-scales", "yes"],
     ["--fold-scales yes: invalid LayerConfig: fold_scales=True: activations that are not fp8", "allowed: auto or no"]),
    (["--layer-json", json.dumps({"n": 256, "k": 1024, "scheme": "w4a8-mxfp4-fp8"}), "--fold-scales", "no"],
     ["--fold-scales no: --layer-json describes the whole layer", "leave out --fold-scales"]),
])
def test_tune_fold_scales_errors(capsys, argv, fragments):
    rc, out, err = _run(capsys, "tune", "--dry-run", *argv)
    assert rc == 2 and err.count("\n") == 1 and all(f in err for f in fragments), err


@pytest.mark.parametrize("scheme,target,act", [
    ("w4a8-mxfp4-fp8", "sm_80", "act=16-bit"),  # no fp8 MMA on sm_80: QuantLinear runs bfloat16 activations
    ("w8a8-int8-channel", "sm_80", "act=int8/token"),  # int8 MMA from sm_80: as the scheme
    ("w4a8-mxfp4-fp8", "sm_90a", "act=float8e4m3/token"),
    ("w4a4-int4-g128", "sm_90a", "act=int8/token"),  # int4 mma.sync emulated on sm_90a: int8 unless strict
])
def test_tune_times_the_compute_type_quantlinear_runs(capsys, scheme, target, act):
    """Where the target has no kernel for the scheme's quantized activations, tune times (and stores under) the
    layer a QuantLinear falls back to, and says so; --strict refuses in one line."""
    rc, out, err = _run(capsys, "tune", "--n", "256", "--k", "1024", "--scheme", scheme, "--target", target,
                        "--m", "16", "--dry-run")
    assert rc == 0, err
    layer_line = next(line for line in out.splitlines() if line.startswith("layer"))
    assert act in layer_line, layer_line
    assert ("do not run on sm_80" in out) == (act == "act=16-bit")
    rc, out, err = _run(capsys, "tune", "--n", "256", "--k", "1024", "--scheme", scheme, "--target", target,
                        "--m", "16", "--dry-run", "--strict")
    if act == "act=16-bit":
        assert rc == 2 and err.count("\n") == 1 and "--strict: float8e4m3 activations do not run on sm_80" in err
    else:
        assert rc == 0, err
    if scheme.startswith("w4a4"):  # strict tunes the emulated int4 MMA, as QuantLinear(strict=True) runs it
        assert "act=int4/token" in next(line for line in out.splitlines() if line.startswith("layer"))


@pytest.mark.parametrize("scheme,target,act,fallback", [
    ("w4a4-nvfp4", "sm_90a", "act=16-bit", "float4e2m1 activations do not run on sm_90a"),  # no fp4 MMA yet
    ("w8a8-fp8-channel", "sm_80", "act=16-bit", "float8e4m3 activations do not run on sm_80"),  # no fp8 MMA
    ("w8a8-int8-channel", "sm_80", "act=int8/token", None),  # the scheme's own kernels
])
def test_inspect_describes_the_kernels_quantlinear_runs(capsys, monkeypatch, tmp_path, scheme, target, act, fallback):
    """Where `presets` shows a fallback (`as bfloat16`), inspect describes the fallback's kernels and says so,
    rather than refusing the scheme; the compute type is the one presets names."""
    from humming_gen.cli import preset_fallback

    monkeypatch.setenv("HUMMING_GEN_CACHE_DIR", str(tmp_path / "cache"))
    rc, out, err = _run(capsys, "inspect", "--n", "256", "--k", "1024", "--scheme", scheme, "--target", target)
    assert rc == 0, err
    layer_line = next(line for line in out.splitlines() if line.startswith("layer"))
    assert act in layer_line and "M 1.." in out and "registers=" in out, out
    if fallback is None:
        assert "fallback" not in out and preset_fallback(scheme, target) is None
    else:
        assert out.startswith(f"fallback: {fallback}") and "--strict shows the scheme's own" in out, out
        assert f"kernels of {preset_fallback(scheme, target)} activations" in out, out


def test_inspect_strict_and_no_path_refuse_in_one_line(capsys):
    """--strict refuses the fallback; where not even the fallback has a kernel (sm_75: no cp.async), inspect
    refuses naming both, before compiling anything."""
    rc, out, err = _run(capsys, "inspect", "--n", "256", "--k", "1024", "--scheme", "w4a4-nvfp4", "--target",
                        "sm_90a", "--strict")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "--strict: float4e2m1 activations do not run on sm_90a" in err
    rc, out, err = _run(capsys, "inspect", "--n", "256", "--k", "1024", "--scheme", "w8a8-fp8-channel", "--target",
                        "sm_75")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "no kernel of this scheme runs on sm_75: not its float8e4m3 activations" in err
    assert "nor the bfloat16 activations a QuantLinear falls back to" in err


def test_subpackages_resolve_through_the_top_level_module():
    """README's `hg.heuristics.choose_tunings(...)` in a fresh interpreter, where nothing has imported the
    subpackage yet; unknown names still raise AttributeError."""
    code = ("import humming_gen as hg, pathlib\n"
            "root = pathlib.Path(hg.__file__).parent\n"
            "names = sorted(p.name for p in root.iterdir() if (p / '__init__.py').exists())\n"
            "assert all(getattr(hg, n).__name__ == 'humming_gen.' + n for n in names), names\n"
            "assert callable(hg.heuristics.choose_tunings) and callable(hg.targets.get_target)\n"
            "try:\n    hg.no_such_name\nexcept AttributeError:\n    print('OK', len(names))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and result.stdout.startswith("OK"), result.stderr
