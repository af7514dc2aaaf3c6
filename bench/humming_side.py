"""Humming side of the bench scripts: the implementation lives in humming_gen/bench/humming.py."""

from humming_gen.bench.humming import FORMATS, HummingUnavailable, humming_layers  # noqa: F401
