"""Device targets as data: one module per target family, each derived from its predecessor."""

from humming_gen.targets.registry import get_target, list_targets
from humming_gen.targets.target import Target

__all__ = ["Target", "get_target", "list_targets"]
