"""Device symbols a rendered component defines and uses (for the provides / needs declarations' test)."""

from __future__ import annotations

import re

from humming_gen.codegen.render import environment

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_FUNCTION = re.compile(r"__device__\s+__forceinline__\s+[\w:<>,&\s*]*?\b(\w+)\s*\(")
_TYPE = re.compile(r"^struct\s+(?:(?:alignas|__align__)\(\d+\)\s+)?(\w+)", re.M)
_CONSTANT = re.compile(r"^constexpr\s+(?:int|u32)\s+(\w+)\s*=", re.M)
_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")


def rendered(component) -> str:
    return environment().get_template(component.template).render(**component.context()) if component.template else ""


def code_of(text: str) -> str:
    return _STRING.sub('""', _COMMENT.sub("", text))


def defined(component) -> set[str]:
    """Top-level functions, types and constants the component's source defines."""
    code = code_of(rendered(component))
    names = set(_FUNCTION.findall(code)) | set(_TYPE.findall(code)) | set(_CONSTANT.findall(code))
    entry = re.search(r'extern "C" __global__ void[^(]*\b(\w+)\(', code)
    return names | ({entry.group(1)} if entry else set())


def used(component, symbols: set[str]) -> set[str]:
    """Which of `symbols` the component's source mentions (beyond its own definitions)."""
    code = code_of(rendered(component))
    return (set(_IDENTIFIER.findall(code)) & symbols) - defined(component)


def declaration_mismatches(plan) -> dict[str, str]:
    """The components of a KernelPlan whose declared provides / needs differ from the symbols their rendered source
    defines / uses: component description -> what it defines and uses against what it declares."""
    from humming_gen.pipelines.common import RENDERED_SYMBOLS

    everything = set(RENDERED_SYMBOLS).union(*(c.provides for c in plan.components))
    wrong = {}
    for c in plan.components:
        found, mentioned = defined(c) - {plan.kernel_name}, used(c, everything)
        if found != set(c.provides) or mentioned != set(c.needs):
            wrong[c.describe()] = (f"defines {sorted(found)} declares {sorted(c.provides)}; "
                                   f"uses {sorted(mentioned)} declares {sorted(c.needs)}")
    return wrong
