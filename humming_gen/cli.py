"""The `humming-gen` command: emit the generated source of a kernel, inspect a layer's kernels, list presets.

    humming-gen emit --n 4096 --k 4096 --scheme w4a16-int4-g128 --target sm_90a --m 1 -o kernel.cu
    humming-gen emit --layer-json '<the "layer" JSON line of a generated header>' --target sm_90a
    humming-gen inspect --n 8192 --k 8192 --scheme w4a16-int4-g128 --target sm_90a
    humming-gen presets
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
    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig
    from humming_gen.heuristics import choose_tunings
    from humming_gen.kernel import build_many
    from humming_gen.targets import get_target

    layer = _layer(args)
    target = get_target(args.target)
    plan = choose_tunings(layer, target)
    print(layer.summary())
    print(ComputeConfig().summary())
    print(f"target  {target.name}")
    plans = {t: compose(layer, ComputeConfig(), t, target) for t in plan.tunings()}
    kernels = dict(zip(plans, build_many(list(plans.values()), compiler=args.compiler)))
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


def cmd_presets(args: argparse.Namespace) -> int:
    from humming_gen.schemes.presets import list_presets, preset

    print(f"kernels on {args.target}: 'yes' = generated today; 'no' = the scheme converts and quantizes, but its "
          f"kernel is not generated yet")
    for name in list_presets():
        reason = preset_status(name, args.target)
        status = "yes" if reason is None else "no "
        line = f"{name:22s} {status}  {preset(name).summary()}"
        print(line if reason is None else f"{line}\n{'':27s}({reason})")
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
    inspect = sub.add_parser("inspect", help="configs, per-M tuning and ptxas figures of a layer's kernels")
    _common(inspect)
    inspect.set_defaults(func=cmd_inspect)
    presets = sub.add_parser("presets", help="list the scheme presets and whether their kernels are generated")
    presets.add_argument("--target", default=DEFAULT_TARGET, help=f"arch string (default {DEFAULT_TARGET})")
    presets.set_defaults(func=cmd_presets)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"humming-gen: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
