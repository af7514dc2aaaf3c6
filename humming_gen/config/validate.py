"""Shared validators and the JSON / stable-hash machinery of the three configs.

Every check raises with the same shape of message, `<Class>.<field>: got <value>; allowed: <what>`, so a user
reading any config error sees which argument was wrong, what they passed and what would have been accepted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import attrs

C = TypeVar("C", bound="JsonConfig")


def fail(owner: str, field: str, value: Any, allowed: str, exc: type[Exception] = ValueError) -> NoReturn:
    """Raise `exc` naming the field, the value given and what is allowed."""
    raise exc(f"{owner}.{field}: got {value!r}; allowed: {allowed}")


def check_choice(owner: str, field: str, value: Any, choices: Sequence[Any]) -> None:
    """`value` must be one of `choices` (compared with ==; a bool never matches a non-bool choice)."""
    if not any(value == c and type(value) is type(c) for c in choices):
        fail(owner, field, value, "one of " + ", ".join(repr(c) for c in choices))


def check_bool(owner: str, field: str, value: Any) -> None:
    """A real bool: 0/1 or "yes" would hide typos in JSON written by hand."""
    if not isinstance(value, bool):
        fail(owner, field, value, "True or False", TypeError)


def check_int(owner: str, field: str, value: Any, *, lo: int | None = None, hi: int | None = None,
              multiple_of: int | None = None, why: str | None = None) -> None:
    """An int (not a bool) in [lo, hi] and, when given, a multiple of `multiple_of`; `why` explains a bound."""
    allowed = "an int"
    if multiple_of is not None:
        allowed = f"a multiple of {multiple_of}"
    if lo is not None and hi is not None:
        allowed += f" in [{lo}, {hi}]"
    elif lo is not None:
        allowed += f" >= {lo}"
    elif hi is not None:
        allowed += f" <= {hi}"
    if why:
        allowed += f" ({why})"
    if not isinstance(value, int) or isinstance(value, bool):
        fail(owner, field, value, allowed, TypeError)
    if (lo is not None and value < lo) or (hi is not None and value > hi) or (
            multiple_of is not None and value % multiple_of != 0):
        fail(owner, field, value, allowed)


def raise_reasons(owner: str, reasons: Iterable[str]) -> None:
    """Cross-field checks collect reasons; raise one ValueError listing all of them (no-op when empty)."""
    reasons = list(reasons)
    if reasons:
        raise ValueError(f"invalid {owner}: " + "; ".join(reasons))


def check_dict_keys(owner: str, d: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """from_dict input must be a mapping whose keys are field names (missing keys take their defaults)."""
    if not isinstance(d, Mapping):
        raise TypeError(f"{owner}.from_dict: expected a dict, got {type(d).__name__}")
    allowed = list(allowed)
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ValueError(f"{owner}.from_dict: unknown keys {unknown}; allowed: {', '.join(allowed)}")


def canonical_json(d: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace, ASCII: the same config gives the same bytes in every process."""
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


class JsonConfig:
    """Mixin for the frozen attrs configs: JSON round trip and a process-independent key and hash.

    A subclass declares the attrs field `_key_cache` (init=False, eq=False) and defines
    `__hash__ = JsonConfig.__hash__` in its body: attrs' eq=True would otherwise reset the inherited hash.
    The key is cached because configs are dictionary keys in the source cache.
    """

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (str, int, bool, None, dict); field name -> value (a `listed_when_set` field only
        when it differs from its default, so configs written before it existed keep their JSON and keys)."""
        return {f.name: getattr(self, f.name) for f in attrs.fields(type(self))
                if f.init and not (f.metadata.get("listed_when_set") and getattr(self, f.name) == f.default)}

    @classmethod
    def from_dict(cls: type[C], d: Mapping[str, Any]) -> C:
        """Inverse of to_dict; missing keys take their defaults, unknown keys are an error."""
        check_dict_keys(cls.__name__, d, [f.name for f in attrs.fields(cls) if f.init])
        return cls(**d)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, compact); `key()` is its sha256."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_json(cls: type[C], s: str) -> C:
        if not isinstance(s, (str, bytes)):
            raise TypeError(f"{cls.__name__}.from_json: expected a JSON string, got {type(s).__name__}")
        return cls.from_dict(json.loads(s))

    def key(self) -> str:
        """sha256 hex of the canonical JSON: stable across processes and Python versions."""
        k = self._key_cache  # type: ignore[attr-defined]
        if k is None:
            k = hashlib.sha256(self.to_json().encode("ascii")).hexdigest()
            object.__setattr__(self, "_key_cache", k)
        return k

    def __hash__(self) -> int:
        # Derived from key(), not from Python's per-process randomized str hash.
        return int(self.key()[:16], 16)
