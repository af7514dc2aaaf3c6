"""Shared pytest setup: tests marked ``gpu`` are skipped on machines without a CUDA device."""

import os

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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With HG_FAILURE_LOG set, append each failure's traceback as it happens: a device call cut by `timeout`
    never reaches pytest's summary, and under xdist the tracebacks only print there."""
    path = os.environ.get("HG_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")
