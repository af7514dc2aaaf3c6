"""The tuning store: autotuned TuningConfigs per (device name, driver version, layer config, M bucket), kept in
``tunings.json`` beside the kernel cache (``HUMMING_GEN_CACHE_DIR``, default ``~/.cache/humming_gen``).

Timings hold for one GPU model under one driver, so entries are keyed by both; an entry of another humming_gen
version is ignored (tunings it chose may no longer compose). Writers take an ``flock`` on ``tunings.json.lock``,
read, merge and ``os.replace`` a temporary file into place, so concurrent tuners lose nothing and readers never
see half a file. A store that cannot be read or parsed is warned about and ignored: a corrupt file must never stop
a QuantLinear from being built with the built-in heuristics.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from humming_gen.config import LayerConfig, TuningConfig
from humming_gen.runtime import env

if TYPE_CHECKING:
    from humming_gen.pipelines.base import TuningPlan
    from humming_gen.targets import Target

STORE_FORMAT = 1
STORE_NAME = "tunings.json"
OPEN_BUCKET = "inf"  # the JSON key of the open-ended bucket (m_max None)


def store_path() -> Path:
    """Where the store lives: beside the kernel cache, following HUMMING_GEN_CACHE_DIR at each call."""
    return env.cache_dir() / STORE_NAME


def bucket_key(m_max: int | None) -> str:
    return OPEN_BUCKET if m_max is None else str(m_max)


def bucket_from_key(key: str) -> int | None:
    return None if key == OPEN_BUCKET else int(key)


def entry_key(device: str, driver: str, layer: LayerConfig) -> str:
    """One store entry per GPU model, driver and layer (LayerConfig.key() covers shape, scheme, bias, dtypes and
    fold_scales: a folded layer's winners were timed on its folded kernels, so they stay apart from its twin's)."""
    return f"{device}|{driver}|{layer.key()}"


@functools.lru_cache(maxsize=8)
def _device_identity(index: int) -> tuple[str, str]:
    import torch

    name = torch.cuda.get_device_name(index)
    try:
        from humming_gen.runtime.module import driver_call

        driver = str(driver_call("cuDriverGetVersion"))
    except Exception:  # no cuda-python: the torch build's CUDA version is the next best witness
        driver = f"torch-cuda-{torch.version.cuda}"
    return name, driver


def device_identity(device: Any = None) -> tuple[str, str] | None:
    """(device name, driver version) of the current (or given) CUDA device; None without one."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device() if device is None else torch.device(device).index
        return _device_identity(0 if index is None else index)
    except Exception:
        return None


def _empty() -> dict[str, Any]:
    return {"format": STORE_FORMAT, "entries": {}}


def _parse(text: str, path: Path) -> dict[str, Any]:
    """The store's dict; ValueError saying what is wrong with it."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != STORE_FORMAT or not isinstance(data.get("entries"), dict):
        raise ValueError(f"{path}: not a humming_gen tuning store of format {STORE_FORMAT}")
    return data


@functools.lru_cache(maxsize=4)
def _read_cached(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    p = Path(path)
    try:
        return _parse(p.read_text(), p)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        warnings.warn(f"humming_gen: ignoring the tuning store {path} ({type(e).__name__}: {e}); the built-in "
                      f"heuristics are used. Re-run `humming-gen tune` or delete the file.", stacklevel=4)
        return _empty()


def read_store(path: Path | None = None) -> dict[str, Any]:
    """The store's contents ({"format", "entries"}); empty when the file is missing, unreadable or corrupt
    (the last two with a warning, once per version of the file)."""
    path = path or store_path()
    try:
        st = path.stat()
    except OSError:
        return _empty()
    return _read_cached(str(path), st.st_mtime_ns, st.st_size)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive flock beside the store: one read-merge-replace at a time, across processes."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as the kernel cache
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def save_entry(device: str, driver: str, layer: LayerConfig, target: str, buckets: Mapping[int | None, dict],
               path: Path | None = None) -> Path:
    """Merge tuned buckets of one layer into the store, atomically; returns the store's path.

    buckets: m_max -> {"tuning": TuningConfig, plus any JSON facts such as "us", "heuristic_us"}. Buckets of the
    entry not named here keep their earlier results. A corrupt store is replaced (with a warning).
    """
    from humming_gen import __version__

    path = path or store_path()
    with _locked(path):
        try:
            data = _parse(path.read_text(), path)
        except FileNotFoundError:
            data = _empty()
        except (OSError, ValueError, UnicodeDecodeError) as e:
            warnings.warn(f"humming_gen: replacing the unreadable tuning store {path} ({type(e).__name__}: {e})",
                          stacklevel=2)
            data = _empty()
        key = entry_key(device, driver, layer)
        entry = data["entries"].get(key)
        if not isinstance(entry, dict) or entry.get("version") != __version__ or entry.get("target") != target:
            entry = {"buckets": {}}
        entry.update(device=device, driver=driver, target=target, version=__version__, layer=layer.summary())
        for m_max, facts in buckets.items():
            tuning = facts["tuning"]
            if not isinstance(tuning, TuningConfig):
                raise TypeError(f"buckets[{m_max!r}]['tuning'] must be a TuningConfig, got {type(tuning).__name__}")
            entry.setdefault("buckets", {})[bucket_key(m_max)] = {**facts, "tuning": tuning.to_dict()}
        data["entries"][key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tunings-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return path


def stored_tunings(layer: LayerConfig, target_name: str, device: str, driver: str,
                   path: Path | None = None) -> dict[int | None, TuningConfig]:
    """The stored winners of `layer` on this device, driver and target, m_max -> TuningConfig; {} when none.
    Entries that do not parse (another version's fields) are skipped with a warning."""
    from humming_gen import __version__

    entry = read_store(path)["entries"].get(entry_key(device, driver, layer))
    if not isinstance(entry, dict) or entry.get("version") != __version__ or entry.get("target") != target_name:
        return {}
    out = {}
    for key, facts in (entry.get("buckets") or {}).items():
        try:
            out[bucket_from_key(key)] = TuningConfig.from_dict(facts["tuning"])
        except (KeyError, TypeError, ValueError) as e:
            warnings.warn(f"humming_gen: ignoring stored tuning of bucket {key} for {layer.summary()} "
                          f"({type(e).__name__}: {e})", stacklevel=3)
    return out


def with_stored(layer: LayerConfig, target: "Target", plan: "TuningPlan") -> "TuningPlan":
    """`plan` with the buckets stored for the current GPU, driver and `target` in place of the heuristics' (a
    stored tuning that no longer composes or reads another weight layout is skipped with a warning); `plan`
    itself without a GPU or a stored entry."""
    identity = device_identity()
    if identity is None:
        return plan
    stored = stored_tunings(layer, target.name, *identity)
    if not stored:
        return plan
    from humming_gen.codegen import compose
    from humming_gen.config import ComputeConfig
    from humming_gen.pipelines.base import TuningPlan

    layout = compose(layer, ComputeConfig(), plan.buckets[0][1], target).layout
    buckets = []
    for m_max, tuning in plan.buckets:
        candidate = stored.get(m_max)
        if candidate is not None and candidate != tuning:
            try:
                same_layout = compose(layer, ComputeConfig(), candidate, target).layout == layout
            except ValueError as e:
                same_layout, why = False, str(e).splitlines()[-1].strip(" -")
            else:
                why = "it reads another weight layout than the layer's other buckets"
            if same_layout:
                tuning = candidate
            else:
                warnings.warn(f"humming_gen: ignoring stored tuning of bucket {bucket_key(m_max)} for "
                              f"{layer.summary()}: {why}", stacklevel=3)
        buckets.append((m_max, tuning))
    return TuningPlan(tuple(buckets))
