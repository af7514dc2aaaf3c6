"""Source assembly: a KernelPlan -> one self-contained .cu (no includes), sections in a fixed order."""

from __future__ import annotations

import functools
import importlib.resources
import json
import re

import jinja2

from humming_gen.pipelines.base import SECTION_ORDER, KernelPlan

VERSION = "0.1.0"


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    root = importlib.resources.files("humming_gen") / "templates"
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), trim_blocks=True, lstrip_blocks=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def render(plan: KernelPlan, *, key: str, compiler: str, options: str) -> str:
    env = environment()
    header = env.get_template("header.cuh.j2").render(
        version=VERSION, kernel_name=plan.kernel_name, key=key, layer_summary=plan.layer.summary(),
        compute_summary=plan.compute.summary(), tuning_summary=plan.tuning.summary(), target=plan.target.name,
        compiler=compiler, options=options, components=[c.describe() for c in plan.components],
        layer_json=json.dumps(plan.layer.to_dict(), sort_keys=True),
        compute_json=json.dumps(plan.compute.to_dict(), sort_keys=True),
        tuning_json=json.dumps(plan.tuning.to_dict(), sort_keys=True))
    parts = ["\nnamespace hg {\n"]
    for family in SECTION_ORDER:
        members = [c for c in plan.components if c.family == family]
        if not members:
            continue
        parts.append(f"\n// ======================================== {family}\n")
        for c in members:
            body = env.get_template(c.template).render(**c.context())
            parts.append(f"\n// ---- {c.describe()}\n{body}")
    parts.append("\n}  // namespace hg\n")
    body = "".join(parts)
    used = [c for c in plan.constants if re.search(rf"cfg::{c[0]}\b", body)]  # a constant nothing reads is not emitted
    return "".join([header, env.get_template("constants.cuh.j2").render(constants=used),
                    env.get_template("params.cuh.j2").render(fields=plan.param_fields), body])
