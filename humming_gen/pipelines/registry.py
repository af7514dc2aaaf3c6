"""Pipeline name (TuningConfig.pipeline) -> the package object that composes, sizes, tunes and packs for it."""

from __future__ import annotations

from humming_gen.pipelines.base import Pipeline, compose_error
from humming_gen.pipelines.standard import STANDARD
from humming_gen.pipelines.warp_specialized import WARP_SPECIALIZED

PIPELINES: dict[str, Pipeline] = {"standard": STANDARD, "warp_specialized": WARP_SPECIALIZED}


def get_pipeline(name: str) -> Pipeline:
    try:
        return PIPELINES[name]
    except KeyError:
        raise compose_error([f"tuning.pipeline={name!r} is not generated yet; available: {sorted(PIPELINES)}"]
                            ) from None
