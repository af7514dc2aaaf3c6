"""Autotuning: candidate tunings around the heuristics, timed on the current GPU with the benchmark method, the
winners stored per (device, driver, layer, M bucket) for choose_tunings and QuantLinear to pick up."""

from humming_gen.tuning.candidates import bucket_of, candidate_tunings
from humming_gen.tuning.store import read_store, save_entry, store_path, stored_tunings

__all__ = ["autotune", "bucket_of", "candidate_tunings", "read_store", "save_entry", "store_path", "stored_tunings"]


def __getattr__(name: str):
    if name in ("autotune", "AutotuneResult"):  # imports torch: only on use
        from humming_gen.tuning import autotune as module

        return getattr(module, name)
    raise AttributeError(f"module 'humming_gen.tuning' has no attribute {name!r}")
