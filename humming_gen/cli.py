"""The `humming-gen` command: emit the generated source of a kernel, inspect a layer's kernels, list presets.

    humming-gen emit --n 4096 --k 4096 --scheme w4a16-int4-g128 --target sm_90a --m 1 -o kernel.cu
    humming-gen inspect --n 8192 --k 8192 --scheme w4a16-int4-g128 --target sm_90a
    humming-gen presets
"""

from __future__ import annotations

import argparse
import json
import sys

from humming_gen.config import ComputeConfig, LayerConfig, TuningConfig


def _scheme(args: argparse.Namespace):
    from humming_gen.schemes.presets import preset
    from humming_gen.schemes.scheme import QuantScheme

    if args.scheme_json:
        return QuantScheme.from_dict(json.loads(args.scheme_json))
    return preset(args.scheme)


def _layer(args: argparse.Namespace) -> LayerConfig:
    return LayerConfig(n=args.n, k=args.k, scheme=_scheme(args), has_bias=args.bias, dtype=args.dtype,
                       out_dtype=args.out_dtype or args.dtype)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, required=True, help="output features")
    p.add_argument("--k", type=int, required=True, help="input features")
    p.add_argument("--scheme", default="w4a16-int4-g128", help="preset name (see `humming-gen presets`)")
    p.add_argument("--scheme-json", help="a QuantScheme as JSON (QuantScheme.to_dict()), instead of --scheme")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--out-dtype", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--bias", action="store_true")
    p.add_argument("--target", default="sm_90a", help="arch string such as sm_80, sm_90a (default sm_90a)")
    p.add_argument("--compiler", choices=("nvrtc", "nvcc"))


def cmd_emit(args: argparse.Namespace) -> int:
    from humming_gen.codegen import compose
    from humming_gen.heuristics import choose_tunings
    from humming_gen.kernel import generate
    from humming_gen.targets import get_target

    layer = _layer(args)
    target = get_target(args.target)
    tuning = TuningConfig.from_json(args.tuning) if args.tuning else choose_tunings(layer, target).for_m(args.m)
    source = generate(compose(layer, ComputeConfig(), tuning, target), args.compiler)
    if args.output == "-":
        sys.stdout.write(source)
    else:
        with open(args.output, "w") as f:
            f.write(source)
        print(f"wrote {args.output} ({len(source.splitlines())} lines)")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from humming_gen.codegen import compose
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


def cmd_presets(args: argparse.Namespace) -> int:
    from humming_gen.schemes.presets import list_presets, preset

    for name in list_presets():
        print(f"{name:28s} {preset(name).summary()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="humming-gen", description=__doc__.splitlines()[0])
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
    presets = sub.add_parser("presets", help="list the scheme presets")
    presets.set_defaults(func=cmd_presets)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"humming-gen: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
