"""Per-GPU utilization, memory, power and energy read through NVML, for Triton's GPU gauges.

Triton exports these per GPU, each labelled ``gpu_uuid="GPU-..."`` (triton-facts §5.1):
``nv_gpu_utilization`` (a ratio 0.0-1.0), ``nv_gpu_memory_total_bytes`` and
``nv_gpu_memory_used_bytes`` (bytes), ``nv_gpu_power_usage`` and ``nv_gpu_power_limit`` (watts)
and the counter ``nv_energy_consumption`` (joules since the server started). NVML reports
utilization in percent, power in milliwatts and energy in millijoules since the driver loaded,
so ``GpuSample`` holds the values already converted to Triton's units, and the monitor keeps the
first energy reading of each GPU so that the counter can start at 0 like Triton's.

The bindings are the module ``pynvml`` from NVIDIA's maintained ``nvidia-ml-py`` distribution.
The deprecated ``pynvml`` distribution does not ship that module any more; it installs a ``.pth``
import hook that emits a ``FutureWarning`` as soon as anything named ``pynvml`` is imported or
even looked up, which a test suite run with warnings as errors turns into a failure (gpu-facts
§0 item 2 and §4). So the installed distributions are inspected from their metadata first, and
``pynvml`` is imported only when ``nvidia-ml-py`` provides it and the deprecated distribution is
absent; otherwise one warning is logged and there are no GPU metrics.

Everything degrades to "no GPU metrics" without an exception: without the bindings, without a
driver (``nvmlInit`` raises ``NVMLError_LibraryNotFound``), without a GPU, and with
``TENSORGATE_DISABLE_CUDA=1`` (the switch that makes a GPU machine behave like a CPU one). Some
queries are not supported on some GPUs (virtualised or consumer boards): such a query leaves its
own field None and the rest of the sample stands.

Threading: ``GpuMonitor.sample()`` and ``close()`` take one lock, so a metrics exporter may call
``sample()`` from a worker thread (each NVML query is a blocking driver call of a few
microseconds to a millisecond) while the server closes the monitor on shutdown.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any, Self

from server.cuda.devices import cuda_disabled

log = logging.getLogger(__name__)

_MAINTAINED_DISTRIBUTION = "nvidia-ml-py"
_DEPRECATED_DISTRIBUTION = "pynvml"
# The deprecated distribution's .pth file imports this module at interpreter start.
_DEPRECATED_HOOK_MODULE = "_pynvml_redirector"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU, in Triton's units; a field NVML could not report is None.

    ``index`` is the NVML index (PCI bus order over every GPU of the machine, which
    ``CUDA_VISIBLE_DEVICES`` does not renumber); ``uuid`` ("GPU-...") is the label to export.
    ``energy_joules`` is NVML's total since the driver loaded; ``energy_since_start_joules`` is
    the energy used since the monitor first read it, which is what ``nv_energy_consumption``
    counts.
    """

    index: int
    uuid: str
    name: str | None
    utilization: float | None
    """Fraction of the last sample period in which a kernel ran, 0.0-1.0."""
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_usage_watts: float | None
    power_limit_watts: float | None
    """The enforced power limit."""
    energy_joules: float | None
    energy_since_start_joules: float | None


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str | None
    energy_baseline_mj: int | None


def _installed(distribution: str) -> bool:
    """Whether ``distribution`` is installed: one lookup by name (scanning every installed
    package's files for who provides ``pynvml`` took 120 ms of each process's start)."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _load_nvml() -> ModuleType | None:
    """The ``pynvml`` module of ``nvidia-ml-py``, or None (the seam tests replace).

    Decided from distribution metadata before anything named ``pynvml`` is imported or looked
    up, because the deprecated distribution's import hook warns on the lookup itself.
    """
    if cuda_disabled():
        log.debug("GPU metrics off: TENSORGATE_DISABLE_CUDA is set")
        return None
    if _DEPRECATED_HOOK_MODULE in sys.modules or _installed(_DEPRECATED_DISTRIBUTION):
        log.warning(
            "GPU metrics off: the deprecated 'pynvml' distribution is installed and warns on "
            "import; uninstall it and install 'nvidia-ml-py'"
        )
        return None
    if not _installed(_MAINTAINED_DISTRIBUTION):
        log.debug("GPU metrics off: nvidia-ml-py is not installed")
        return None
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        log.info("GPU metrics off: importing pynvml failed: %s", exc)
        return None


def _text(value: str | bytes) -> str:
    """NVML strings: str in current nvidia-ml-py, bytes in older releases."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class GpuMonitor:
    """The GPUs NVML sees, initialised once; ``sample()`` reads them all.

    Build it with ``GpuMonitor.start()``; a monitor without NVML or without GPUs has
    ``available`` False and samples nothing.
    """

    def __init__(self, nvml: ModuleType | None, devices: list[_Device]) -> None:
        """Use ``start()``; this takes an initialised ``nvml`` and its devices as they are."""
        self._nvml = nvml
        self._devices = devices
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls, devices: Collection[int | str] | None = None, *, nvml: ModuleType | None = None
    ) -> GpuMonitor:
        """Initialise NVML once and cache the handles, UUIDs and names of the GPUs.

        ``devices`` restricts the monitor to some GPUs: an int is an NVML index, a str a UUID
        ("GPU-..."). Prefer UUIDs for the server's CUDA devices, because CUDA's device numbers
        follow ``CUDA_VISIBLE_DEVICES`` and CUDA's own ordering while NVML's do not. ``nvml``
        replaces the imported ``pynvml`` module (for tests). Never raises for a missing or
        unusable NVML: the monitor is then unavailable.
        """
        if nvml is None:
            nvml = _load_nvml()
        if nvml is None:
            return cls(None, [])
        error: type[Exception] = nvml.NVMLError
        try:
            nvml.nvmlInit()
        except error as exc:
            log.info("GPU metrics off: NVML did not initialise: %s", exc)
            return cls(None, [])
        try:
            found = cls._discover(nvml, error, devices)
        except BaseException:
            _shutdown(nvml, error)
            raise
        if not found:
            log.info("GPU metrics off: NVML sees no GPU%s", "" if devices is None else " selected")
            _shutdown(nvml, error)
            return cls(None, [])
        log.info("GPU metrics: %s", ", ".join(f"{d.index}: {d.name} {d.uuid}" for d in found))
        return cls(nvml, found)

    @staticmethod
    def _discover(
        nvml: ModuleType, error: type[Exception], wanted: Collection[int | str] | None
    ) -> list[_Device]:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except error as exc:
            log.info("NVML could not count the GPUs: %s", exc)
            return []
        found: list[_Device] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except error as exc:
                log.warning("GPU %d left out of the GPU metrics: %s", index, exc)
                continue
            if wanted is not None and index not in wanted and uuid not in wanted:
                continue
            name = _query(error, nvml.nvmlDeviceGetName, handle)
            energy = _query(error, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            found.append(
                _Device(
                    index,
                    handle,
                    uuid,
                    name=None if name is None else _text(name),
                    energy_baseline_mj=None if energy is None else int(energy),
                )
            )
        if wanted is not None:
            missing = set(wanted) - {d.index for d in found} - {d.uuid for d in found}
            if missing:
                listed = ", ".join(sorted(str(device) for device in missing))
                log.warning("GPU metrics: no GPU matches %s", listed)
        return found

    @property
    def available(self) -> bool:
        """Whether NVML is initialised and sees at least one (selected) GPU."""
        return self._nvml is not None

    @property
    def uuids(self) -> list[str]:
        """The UUIDs of the monitored GPUs, in NVML index order (empty when unavailable)."""
        return [device.uuid for device in self._devices] if self._nvml is not None else []

    def sample(self) -> list[GpuSample]:
        """Read every monitored GPU now; [] when unavailable or closed. Thread-safe."""
        with self._lock:
            if self._nvml is None:
                return []
            return [self._sample(self._nvml, device) for device in self._devices]

    def close(self) -> None:
        """Shut NVML down (once; later calls and ``sample()`` do nothing). Thread-safe."""
        with self._lock:
            nvml, self._nvml = self._nvml, None
            if nvml is not None:
                _shutdown(nvml, nvml.NVMLError)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @staticmethod
    def _sample(nvml: ModuleType, device: _Device) -> GpuSample:
        error: type[Exception] = nvml.NVMLError
        handle = device.handle
        rates = _query(error, nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = _query(error, nvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = _query(error, nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = _query(error, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        energy = _query(error, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        energy_mj = None if energy is None else int(energy)
        since_start: float | None = None
        if energy_mj is not None:
            if device.energy_baseline_mj is None:
                device.energy_baseline_mj = energy_mj
            since_start = max(energy_mj - device.energy_baseline_mj, 0) / 1000
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            name=device.name,
            utilization=None if rates is None else int(rates.gpu) / 100,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_usage_watts=None if power_mw is None else int(power_mw) / 1000,
            power_limit_watts=None if limit_mw is None else int(limit_mw) / 1000,
            energy_joules=None if energy_mj is None else energy_mj / 1000,
            energy_since_start_joules=since_start,
        )


def _query(error: type[Exception], query: Callable[..., Any], handle: Any) -> Any | None:
    """``query(handle)``, or None when NVML refuses it (not supported, no permission, GPU lost)."""
    try:
        return query(handle)
    except error as exc:
        log.debug("NVML query failed: %s", exc)
        return None


def _shutdown(nvml: ModuleType, error: type[Exception]) -> None:
    try:
        nvml.nvmlShutdown()
    except error as exc:
        log.debug("nvmlShutdown failed: %s", exc)
