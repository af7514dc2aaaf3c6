"""The three frozen configs of a kernel: LayerConfig (what), ComputeConfig (how), TuningConfig (how fast)."""

from humming_gen.config.compute import ComputeConfig
from humming_gen.config.layer import LayerConfig
from humming_gen.config.tuning import TuningConfig

__all__ = ["ComputeConfig", "LayerConfig", "TuningConfig"]
