"""The Component base: a small frozen object that owns one Jinja template and the values it renders."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs


@attrs.frozen
class Component:
    """One concern of a kernel. Fields are resolved values (ints, strings); the template receives them as
    variables, plus whatever `extra_context` adds. `requires` names target features (see humming_gen.targets)."""

    template: ClassVar[str] = ""
    family: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    ptx: ClassVar[tuple[str, ...]] = ()  # ptx wrappers (components.ptx names) this component's code calls
    # Device symbols (functions, types, constants) its source defines, and those of other components it uses;
    # compose checks that every need is provided by a component rendered before it (pipelines.common), and
    # tests/cpu/test_component_symbols.py that the declarations match the rendered source.
    provides: ClassVar[frozenset[str]] = frozenset()
    needs: ClassVar[frozenset[str]] = frozenset()

    def context(self) -> dict[str, Any]:
        ctx = {f.name: getattr(self, f.name) for f in attrs.fields(type(self))}
        ctx.update(self.extra_context())
        return ctx

    def extra_context(self) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        """One line for the generated header: name and parameters (an `option_field` only when set)."""
        params = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in attrs.fields(type(self))
                           if not f.name.startswith("_")
                           and not (f.metadata.get("listed_when_set") and getattr(self, f.name) == f.default))
        return f"{self.family}.{type(self).__name__}({params})"


def option_field(default: Any = False) -> Any:
    """A component field for an option added after kernels were generated without it: `describe` lists it only
    when it differs from `default`, so the sources (and cache keys) of kernels that do not use it stay as they were."""
    return attrs.field(default=default, metadata={"listed_when_set": True})
