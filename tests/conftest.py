"""Shared pytest setup: tests marked ``gpu`` are skipped on machines without a CUDA device."""

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # importing torch costs a second or two: only do it when a gpu test was collected
    try:
        import torch

        available = torch.cuda.is_available()
    except Exception:
        available = False
    if available:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
