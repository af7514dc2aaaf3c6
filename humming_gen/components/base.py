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

    def context(self) -> dict[str, Any]:
        ctx = {f.name: getattr(self, f.name) for f in attrs.fields(type(self))}
        ctx.update(self.extra_context())
        return ctx

    def extra_context(self) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        """One line for the generated header: name and parameters."""
        params = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in attrs.fields(type(self))
                           if not f.name.startswith("_"))
        return f"{self.family}.{type(self).__name__}({params})"
