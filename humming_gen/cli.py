"""The `humming-gen` command: emit the generated source of a kernel, inspect a layer's kernels, list presets.

    humming-gen emit --n 4096 --k 4096 --scheme w4a16-int4-g128 --target sm_90a --m 1 -o kernel.cu
    humming-gen emit --layer-json '<the "layer" JSON line of a generated header>' --target sm_90a
    humming-gen inspect --n 8192 --k 8192 --scheme w4a16-int4-g128 --target sm_90a
    humming-gen presets
    humming-gen tune --n 4096 --k 4096 --scheme w4a16-int4-g128 --m 1,16,64,256,1024   (on a GPU)
    humming-gen bench --formats w4a16-int4-g128 --shapes 8192x8192 --m 1,16,64 --out bench_out   (on a GPU)
"""

from __future__ import annotations

# Only the standard library is imported here: `humming-gen --help` and `--version` must not wait for torch.
import argparse
import json
import sys
from typing import Any

DEFAULT_TARGET = "sm_90a"


def _json_option(option: str, text: str) -> dict[str, Any]:
    """The JSON object given to `option`; ValueError naming the option otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{option}: not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{option}: expected a JSON object, got a JSON {type(value).__name__}")
    return value


def _scheme(args: argparse.Namespace):
    from humming_gen.schemes.presets import preset
    from humming_gen.schemes.scheme import QuantScheme

    if args.scheme_json:
        try:
            return QuantScheme.from_dict(_json_option("--scheme-json", args.scheme_json))
        except (ValueError, TypeError) as e:
            raise ValueError(e if str(e).startswith("--scheme-json") else f"--scheme-json: {e}") from None
    try:
        return preset(args.scheme)
    except ValueError as e:
        raise ValueError(f"--scheme: {e}") from None


def _layer(args: argparse.Namespace):
    from humming_gen.config import LayerConfig

    if args.layer_json:
        given = [opt for opt, value in (("--n", args.n), ("--k", args.k), ("--scheme-json", args.scheme_json))
                 if value is not None]
        if given:
            raise ValueError(f"--layer-json describes the whole layer; leave out {', '.join(given)}")
        try:
            return LayerConfig.from_dict(_json_option("--layer-json", args.layer_json))
        except (ValueError, TypeError) as e:
            raise ValueError(e if str(e).startswith("--layer-json") else f"--layer-json: {e}") from None
    missing = [opt for opt, value in (("--n", args.n), ("--k", args.k)) if value is None]
    if missing:
        raise ValueError(f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} required (or --layer-json)")
    return LayerConfig(n=args.n, k=args.k, scheme=_scheme(args), has_bias=args.bias, dtype=args.dtype,
                       out_dtype=args.out_dtype or args.dtype)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, help="output features")
    p.add_argument("--k", type=int, help="input features")
    p.add_argument("--scheme", default="w4a16-int4-g128", help="preset name (see `humming-gen presets`)")
    p.add_argument("--scheme-json", help="a QuantScheme as JSON (QuantScheme.to_dict()), instead of --scheme; a "
                   "custom element format is given in full: \"weight\": {\"kind\": \"float\", \"name\": \"e2m2\", "
                   "\"exponent_bits\": 2, \"mantissa_bits\": 2}")
    p.add_argument("--layer-json", help="a whole LayerConfig as JSON (the `layer` line of a generated header), "
                   "instead of --n, --k and the scheme options")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--out-dtype", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--bias", action="store_true")
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"arch string such as sm_80, sm_90a (default {DEFAULT_TARGET})")
    p.add_argument("--compiler", choices=("nvrtc", "nvcc"))


def cmd_emit(args: argparse.Namespace) -> int:
    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig, TuningConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.kernel import generate
    from humming_gen.targets import get_target

    layer = _layer(args)
    target = get_target(args.target)
    if args.tuning:
        try:
            tuning = TuningConfig.from_dict(_json_option("--tuning", args.tuning))
        except (ValueError, TypeError) as e:
            raise ValueError(e if str(e).startswith("--tuning") else f"--tuning: {e}") from None
    else:
        if args.m < 1:
            raise ValueError(f"--m {args.m}: the rows the kernel is tuned for must be at least 1")
        tuning = choose_tunings(layer, target).for_m(args.m)
    source = generate(compose(layer, ComputeConfig(), tuning, target), args.compiler)
    if args.output == "-":
        sys.stdout.write(source)
    else:
        try:
            with open(args.output, "w") as f:
                f.write(source)
        except OSError as e:
            raise ValueError(f"-o/--output: cannot write {args.output!r}: {e.strerror or e}") from None
        print(f"wrote {args.output} ({len(source.splitlines())} lines)")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe the kernels a QuantLinear of the layer runs on the target: the compute-type fallback where the
    scheme's own activations have no kernel there (saying so), refused only where no kernel runs at all."""
    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.kernel import build_many
    from humming_gen.targets import get_target

    requested = _layer(args)
    target = get_target(args.target)
    layer, choice = _runs_as(args, requested, target, "inspect")
    plan = choose_tunings(layer, target)
    plans = {t: compose(layer, ComputeConfig(), t, target) for t in plan.tunings()}
    kernels = dict(zip(plans, build_many(list(plans.values()), compiler=args.compiler)))
    if choice is not None and choice.reasons:
        act = requested.scheme.activation.dtype.name
        print(f"fallback: {act} activations do not run on {target.name} ({choice.reasons[0]}); these are the "
              f"kernels of {choice.compute_dtype} activations, which a QuantLinear of this scheme runs with the "
              f"weights unchanged (--strict shows the scheme's own kernels where they exist)")
    print(layer.summary())
    print(ComputeConfig().summary())
    print(f"target  {target.name}")
    lo = 1
    for m_max, tuning in plan.buckets:
        kernel = kernels[tuning]
        res = kernel.resources
        rows = f"M {lo}..{m_max if m_max is not None else 'inf'}"
        lo = (m_max or 0) + 1
        print(f"\n{rows}: {kernel.name}")
        print(f"  {tuning.summary()}")
        print(f"  threads={kernel.plan.threads} dynamic_smem={kernel.plan.shared_bytes} B "
              f"registers={res.get('registers', '?')} stack={res.get('stack_bytes', '?')} B "
              f"spills={res.get('spill_store_bytes', '?')}/{res.get('spill_load_bytes', '?')} B (store/load)")
    return 0


def _tune_candidates(layer, target, ms: list[int]) -> dict:
    """m_max -> candidate tunings of the buckets holding `ms` (what `tune` would time)."""
    from humming_gen.heuristics import heuristic_tunings
    from humming_gen.tuning.candidates import bucket_of, candidate_tunings

    plan = heuristic_tunings(layer, target)
    buckets = dict.fromkeys(bucket_of(plan, m) for m in sorted(set(ms)))
    return {b: candidate_tunings(layer, target, b, heuristic=plan) for b in buckets}


def _tune_target(args: argparse.Namespace):
    """The target `tune` builds kernels for: --target, else the current GPU's (the one timing them); with --dry-run
    and no --target, the default."""
    import torch

    from humming_gen.targets import Target, get_target

    if args.target or args.dry_run:
        return get_target(args.target or DEFAULT_TARGET)
    if not torch.cuda.is_available():
        raise ValueError("tune times kernels on the current GPU, and torch sees none (torch.cuda.is_available() is "
                         "False); --dry-run lists the candidates without one")
    try:
        return Target.current()
    except RuntimeError as e:  # a GPU without a target
        raise ValueError(f"tune: {e}") from None


def _runs_as(args: argparse.Namespace, layer, target, command: str):
    """(`layer` with the activation scheme a QuantLinear of it runs on `target`, the ComputeChoice or None) for tune
    and inspect, so that they work on the kernels QuantLinear runs: the 16-bit kernels where QuantLinear runs the
    activations' values by default (compute_type.dequantized_activations_default; --strict keeps the 8-bit ones,
    as QuantLinear(strict=True) does); where the target has no kernel for the scheme's
    quantized activations (e.g. fp8 on sm_80) or only emulates their MMA, the compute-type fallback of
    humming_gen.layer.compute_type (as QuantLinear decides it); --strict refuses instead (and takes an emulated
    MMA). A --layer-json layer, or one of 16-bit activations, is taken as given (None). ValueError where not even
    the fallback has a kernel on the target."""
    import attrs

    from humming_gen.config import ComputeConfig
    from humming_gen.layer.compute_type import kernel_reasons, resolve

    if args.layer_json or layer.scheme.activation is None:
        return layer, None
    from humming_gen.layer.compute_type import dequantized_activations_default

    if not args.strict and dequantized_activations_default(layer.scheme.activation, layer.dtype, target):
        print(f"{command}: a QuantLinear of this scheme runs its {layer.scheme.activation.dtype.name} activations as "
              f"bf16 values on the 16-bit kernels on {target.name} (dequantize_activations, the default there): "
              f"these kernels (--strict: the 8-bit ones)")
        return attrs.evolve(layer, scheme=attrs.evolve(layer.scheme, activation=None)), None

    def reasons(scheme) -> list[str]:
        return kernel_reasons(layer.n, layer.k, scheme, ComputeConfig(), target, has_bias=layer.has_bias,
                              dtype=layer.dtype, out_dtype=layer.out_dtype)

    act = layer.scheme.activation.dtype.name
    # --strict takes an MMA the target emulates, as QuantLinear(strict=True) runs it
    choice = resolve(layer.scheme, layer.dtype, target.name, reasons, strict=False, weight_only=False,
                     who=f"humming-gen {command}", log=False,
                     emulated_mma=frozenset() if args.strict else target.emulated_mma)
    if choice.reasons and args.strict:
        raise ValueError(f"--strict: {act} activations do not run on {target.name} ({choice.reasons[0]}); without "
                         f"--strict {command} takes the compute type a QuantLinear falls back to")
    if choice.reasons:
        fallback_reasons = reasons(choice.scheme)
        if fallback_reasons:  # resolve's last resort (16-bit activations) is not checked there
            raise ValueError(f"no kernel of this scheme runs on {target.name}: not its {act} activations "
                             f"({choice.reasons[0]}), nor the {choice.compute_dtype} activations a QuantLinear "
                             f"falls back to ({fallback_reasons[0]})")
    return attrs.evolve(layer, scheme=choice.scheme), choice


def _tune_compute(args: argparse.Namespace, layer, target):
    """`layer` as a QuantLinear of it runs on `target` (_runs_as), so that the winners are stored under the key
    that QuantLinear looks up; says so where that is a compute-type fallback."""
    runs, choice = _runs_as(args, layer, target, "tune")
    if choice is not None and choice.reasons:
        print(f"{layer.scheme.activation.dtype.name} activations do not run on {target.name} ({choice.reasons[0]}); "
              f"tuning {choice.compute_dtype} activations, as a QuantLinear of this scheme runs (--strict refuses)")
    return runs


def _tune_fold(args: argparse.Namespace, layer, target):
    """`layer` with fold_scales set by --fold-scales. Stored winners are keyed by fold_scales and a QuantLinear looks
    up the layer it builds, so auto (the default) tunes that one: folded where the scheme folds and the target's
    heuristic kernels read folded scales (QuantLinear's fold_serves), as for weights whose scale exponents fit the
    fold's window (typical ones; humming_gen.layer.weights.scales_fold)."""
    import attrs

    from humming_gen.components.numeric.exponent_fold import fold_reasons
    from humming_gen.heuristics import heuristic_tunings
    from humming_gen.layer.weights import fold_serves

    if args.layer_json:
        if args.fold_scales is not None:
            raise ValueError(f"--fold-scales {args.fold_scales}: --layer-json describes the whole layer, its "
                             f"fold_scales included; leave out --fold-scales")
        return layer
    fold = args.fold_scales or "auto"
    if fold == "no":
        return layer
    if fold == "yes":
        try:
            return attrs.evolve(layer, fold_scales=True)
        except ValueError as e:
            raise ValueError(f"--fold-scales yes: {e}; allowed: auto or no") from None
    if fold_reasons(layer.scheme):
        return layer
    folded = attrs.evolve(layer, fold_scales=True)
    return folded if fold_serves(folded, heuristic_tunings(folded, target), target) else layer


def cmd_tune(args: argparse.Namespace) -> int:
    from humming_gen.bench import parse_ms

    layer = _layer(args)
    ms = parse_ms("--m", args.m)
    target = _tune_target(args)
    layer = _tune_fold(args, _tune_compute(args, layer, target), target)
    if args.dry_run:
        print(layer.summary())
        for m_max, tunings in _tune_candidates(layer, target, ms).items():
            print(f"\nbucket M <= {m_max if m_max is not None else 'inf'}: {len(tunings)} candidates "
                  f"(the first is the heuristics')")
            for t in tunings:
                print(f"  {t.summary()}")
        return 0
    from humming_gen.tuning.autotune import autotune

    try:
        results = autotune(layer, ms, target=target, rounds=args.rounds, replays=args.replays,
                           store=not args.no_store, compiler=args.compiler)
    except RuntimeError as e:
        raise ValueError(str(e)) from None
    print("\n| bucket | M | heuristic us | tuned us | gain |")
    print("|---|---|---|---|---|")
    for r in results:
        for m in r["ms"]:
            print(f"| <= {r['m_max'] if r['m_max'] is not None else 'inf'} | {m} | {r['heuristic_us'][m]:.1f} | "
                  f"{r['us'][m]:.1f} | x{r['heuristic_us'][m] / r['us'][m]:.3f} |")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from humming_gen.bench import parse_formats, parse_ms, parse_shapes
    from humming_gen.bench.report import format_table, plot_results, write_json

    formats = parse_formats("--formats", args.formats)
    shapes = parse_shapes("--shapes", args.shapes)
    ms = parse_ms("--m", args.m)
    standard = parse_formats("--standard", args.standard) if args.standard else []
    if args.layers < 1 or args.replays < 1:
        raise ValueError(f"--layers {args.layers} / --replays {args.replays}: both must be at least 1")
    from humming_gen.bench.run import run_benchmark

    try:
        results = run_benchmark(formats, shapes, ms, min_layers=args.layers, replays=args.replays,
                                humming=not args.no_humming, standard=standard)
    except RuntimeError as e:
        raise ValueError(str(e)) from None
    out = Path(args.out)
    print(format_table(results))
    print(f"\nwrote {write_json(results, out / 'bench.json')}")
    if args.no_plot:
        return 0
    try:
        for path in plot_results(results, out / "bench"):
            print(f"wrote {path}")
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
    return 0


def preset_status(name: str, target_name: str = DEFAULT_TARGET) -> str | None:
    """None when a kernel of preset `name` can be generated for `target_name` (a 4096 x 4096 layer), else the
    first reason it cannot."""
    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.targets import get_target

    target = get_target(target_name)
    layer = LayerConfig(n=4096, k=4096, scheme=name)
    try:
        compose(layer, ComputeConfig(), choose_tunings(layer, target).for_m(1), target)
    except ValueError as e:
        reasons = [line.strip(" -") for line in str(e).splitlines()[1:] if line.strip()]
        return reasons[0] if reasons else str(e)
    return None


def preset_fallback(name: str, target_name: str) -> str | None:
    """The compute type QuantLinear falls back to for preset `name` on the target (humming_gen.layer.compute_type)
    when the scheme's own activations have no kernel there, or only one whose MMA the target emulates (int4 on
    sm_90a); None when nothing runs or no fallback is needed."""
    choice = _preset_choice(name, target_name)
    return None if choice is None else choice.compute_dtype


_UNCOMPOSED = "no kernel composes"  # _preset_choice's reason for a scheme preset_status then explains


def _preset_choice(name: str, target_name: str):
    """resolve()'s ComputeChoice for a fallback that has a kernel on the target, else None."""
    from humming_gen.layer.compute_type import resolve
    from humming_gen.schemes.presets import preset
    from humming_gen.targets import get_target

    scheme = preset(name)
    if scheme.activation is None:
        return None
    choice = resolve(scheme, "bfloat16", target_name,
                     lambda s: [] if _scheme_composes(s, target_name) else [_UNCOMPOSED],
                     strict=False, weight_only=False, who="presets", log=False,
                     emulated_mma=get_target(target_name).emulated_mma)
    if not choice.reasons or not _scheme_composes(choice.scheme, target_name):
        return None
    return choice


def _scheme_composes(scheme, target_name: str) -> bool:
    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig, LayerConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.targets import get_target

    target = get_target(target_name)
    layer = LayerConfig(n=4096, k=4096, scheme=scheme)
    try:
        compose(layer, ComputeConfig(), choose_tunings(layer, target).for_m(1), target)
    except ValueError:
        return False
    return True


def cmd_presets(args: argparse.Namespace) -> int:
    from humming_gen.schemes.presets import list_presets, preset

    from humming_gen.layer.compute_type import dequantized_activations_default
    from humming_gen.targets import get_target

    print(f"kernels on {args.target}: 'yes' = generated today; 'as X' = the scheme's activations have no kernel "
          f"there, QuantLinear runs X activations with the weights unchanged (strict=True refuses); 'as values' = "
          f"QuantLinear quantizes the activations and runs their bf16 values on the 16-bit kernels (faster there; "
          f"dequantize_activations=False runs the 8-bit kernels); 'no' = the scheme converts and quantizes, but its "
          f"kernel is not generated yet")
    target = get_target(args.target)
    for name in list_presets():
        # an emulated MMA (int4 on sm_90a) composes, but QuantLinear runs the fallback: say what runs
        reason = preset_status(name, args.target)
        choice = _preset_choice(name, args.target)
        if choice is not None and choice.reasons[0] != _UNCOMPOSED:
            reason = choice.reasons[0]
        status = f"as {choice.compute_dtype}" if choice else "yes" if reason is None else "no "
        act = preset(name).activation
        if status == "yes" and act is not None and dequantized_activations_default(act, "bfloat16", target):
            status = "as values"
        line = f"{name:22s} {status:11s}  {preset(name).summary()}"
        print(line if reason is None else f"{line}\n{'':36s}({reason})")
    return 0


def _version() -> str:
    from humming_gen import __version__

    return f"humming-gen {__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="humming-gen", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    emit = sub.add_parser("emit", help="write the generated .cu of one kernel")
    _common(emit)
    emit.add_argument("--m", type=int, default=1, help="rows the kernel is tuned for (picks the M bucket)")
    emit.add_argument("--tuning", help="a TuningConfig as JSON, instead of the heuristic choice")
    emit.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    emit.set_defaults(func=cmd_emit)
    inspect = sub.add_parser("inspect", help="configs, per-M tuning and ptxas figures of a layer's kernels (those "
                             "a QuantLinear runs: the compute-type fallback where the scheme's activations have no "
                             "kernel on the target)")
    _common(inspect)
    inspect.add_argument("--strict", action="store_true", help="the scheme's own kernels: refuse a scheme whose "
                         "quantized activations have no kernel on the target, instead of showing the compute type a "
                         "QuantLinear falls back to (e.g. w4a4-nvfp4 on sm_90a: bfloat16 activations), and show an "
                         "MMA the target emulates (QuantLinear(strict=True))")
    inspect.set_defaults(func=cmd_inspect)
    presets = sub.add_parser("presets", help="list the scheme presets and whether their kernels are generated")
    presets.add_argument("--target", default=DEFAULT_TARGET, help=f"arch string (default {DEFAULT_TARGET})")
    presets.set_defaults(func=cmd_presets)
    tune = sub.add_parser("tune", help="time candidate tunings on this GPU and store the winners per M bucket")
    _common(tune)
    tune.set_defaults(target=None)
    next(a for a in tune._actions if a.dest == "target").help = (
        f"arch string such as sm_80, sm_90a (default: the current GPU's, which times the kernels; {DEFAULT_TARGET} "
        f"with --dry-run)")
    tune.add_argument("--m", default="1,16,64,256,1024", help="token counts to tune for, comma-separated")
    tune.add_argument("--rounds", type=int, default=3, help="rounds over the candidates (order rotated)")
    tune.add_argument("--replays", type=int, default=10, help="CUDA graph replays per timing")
    tune.add_argument("--fold-scales", choices=("auto", "yes", "no"),
                      help="fold the e8m0 group scales into the fp8 weight operand (LayerConfig.fold_scales, part "
                      "of the stored key). auto (default): as a QuantLinear of weights whose scales fold would, so "
                      "that it finds the winners: yes where the scheme folds (e.g. w4a8-mxfp4-fp8) and the "
                      "target's heuristic kernels read folded scales (warp-specialized, sm_90a), else no. yes / no "
                      "force it (no for weights whose scale exponents are too spread to fold). Not with "
                      "--layer-json (its fold_scales)")
    tune.add_argument("--strict", action="store_true", help="refuse a scheme whose quantized activations have no "
                      "kernel on the target, instead of tuning the compute type a QuantLinear falls back to (e.g. "
                      "w4a8-mxfp4-fp8 on sm_80: bfloat16 activations)")
    tune.add_argument("--no-store", action="store_true", help="print the results without storing them")
    tune.add_argument("--dry-run", action="store_true", help="list the candidates only (no GPU needed; target "
                      f"default {DEFAULT_TARGET})")
    tune.set_defaults(func=cmd_tune)
    from humming_gen.bench import DEFAULT_FORMATS, DEFAULT_MS, DEFAULT_SHAPES

    bench = sub.add_parser("bench", help="the canonical benchmark beside cuBLAS bf16 (and Humming): table, "
                           "JSON, plot")
    bench.add_argument("--formats", default=",".join(DEFAULT_FORMATS), help="preset names, comma-separated")
    bench.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in DEFAULT_SHAPES),
                       help="N x K shapes, e.g. 4096x4096,14336x4096")
    bench.add_argument("--m", default=",".join(map(str, DEFAULT_MS)), help="token counts, comma-separated")
    bench.add_argument("--layers", type=int, default=8, help="distinct layers per timing at least (more where "
                       "needed to keep the weights several times the L2)")
    bench.add_argument("--replays", type=int, default=20, help="CUDA graph replays per timing (median)")
    bench.add_argument("--standard", default="", help="formats also timed on the standard pipeline only")
    bench.add_argument("--no-humming", action="store_true", help="skip Humming even where it is installed")
    bench.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    bench.add_argument("--out", default="bench_out", help="directory of bench.json and the plots")
    bench.set_defaults(func=cmd_bench)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"humming-gen: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
