"""GPU metrics through a fake NVML module: units, labels, unsupported queries, lifecycle.

No GPU is needed. The fake mimics nvidia-ml-py's ``pynvml``: module-level functions, an
``NVMLError`` exception class, UUIDs and names as str (or bytes, as older releases returned).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any

import pytest

from server.observability import gpu_metrics
from server.observability.gpu_metrics import GpuMonitor, GpuSample


class FakeNVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str | bytes
    name: str | bytes
    utilization_percent: int = 0
    memory_used: int = 0
    memory_total: int = 0
    power_mw: int = 0
    power_limit_mw: int = 0
    energy_mj: int = 0
    unsupported: set[str] = field(default_factory=set)
    """Names of the NVML functions that raise NVMLError for this GPU."""


class FakeNvml:
    """The state behind a fake ``pynvml`` module, with call counts."""

    def __init__(self, gpus: list[FakeGpu], *, init_error: bool = False) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0

    def module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")
        for name, value in {
            "NVMLError": FakeNVMLError,
            "nvmlInit": self.init,
            "nvmlShutdown": self.shutdown,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlDeviceGetHandleByIndex": self.handle,
        }.items():
            setattr(module, name, value)
        for function, read in {
            "nvmlDeviceGetUUID": lambda gpu: gpu.uuid,
            "nvmlDeviceGetName": lambda gpu: gpu.name,
            "nvmlDeviceGetUtilizationRates": lambda gpu: types.SimpleNamespace(
                gpu=gpu.utilization_percent, memory=0
            ),
            "nvmlDeviceGetMemoryInfo": lambda gpu: types.SimpleNamespace(
                total=gpu.memory_total,
                used=gpu.memory_used,
                free=gpu.memory_total - gpu.memory_used,
            ),
            "nvmlDeviceGetPowerUsage": lambda gpu: gpu.power_mw,
            "nvmlDeviceGetEnforcedPowerLimit": lambda gpu: gpu.power_limit_mw,
            "nvmlDeviceGetTotalEnergyConsumption": lambda gpu: gpu.energy_mj,
        }.items():
            setattr(module, function, self._query(function, read))
        return module

    def init(self) -> None:
        self.init_calls += 1
        if self.init_error:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def shutdown(self) -> None:
        self.shutdown_calls += 1

    def handle(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise FakeNVMLError("Invalid Argument")
        return self.gpus[index]

    @staticmethod
    def _query(function: str, read: Any) -> Any:
        def query(handle: FakeGpu) -> Any:
            if function in handle.unsupported:
                raise FakeNVMLError("Not Supported")
            return read(handle)

        return query


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid="GPU-00000000-1111-2222-3333-444444444444",
            name="NVIDIA H200",
            utilization_percent=37,
            memory_used=81_604_378_624,
            memory_total=150_754_820_096,
            power_mw=123_456,
            power_limit_mw=700_000,
            energy_mj=987_654_321,
        ),
        FakeGpu(
            uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
            name="NVIDIA H200",
            utilization_percent=100,
            memory_used=0,
            memory_total=150_754_820_096,
            power_mw=75_001,
            power_limit_mw=700_000,
            energy_mj=5,
        ),
    ]


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(two_gpus())


@pytest.fixture
def monitor(fake: FakeNvml) -> Iterator[GpuMonitor]:
    started = GpuMonitor.start(nvml=fake.module())
    yield started
    started.close()


def test_samples_are_in_triton_units(monitor: GpuMonitor) -> None:
    assert monitor.available
    first, second = monitor.sample()
    assert first == GpuSample(
        index=0,
        uuid="GPU-00000000-1111-2222-3333-444444444444",
        name="NVIDIA H200",
        utilization=0.37,
        memory_used_bytes=81_604_378_624,
        memory_total_bytes=150_754_820_096,
        power_usage_watts=123.456,
        power_limit_watts=700.0,
        energy_joules=987_654.321,
        energy_since_start_joules=0.0,
    )
    assert second.index == 1
    assert second.uuid == "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert second.utilization == 1.0
    assert second.memory_used_bytes == 0
    assert second.power_usage_watts == 75.001
    assert second.energy_joules == 0.005
    assert monitor.uuids == [first.uuid, second.uuid]


def test_sample_is_frozen(monitor: GpuMonitor) -> None:
    sample = monitor.sample()[0]
    with pytest.raises(FrozenInstanceError):
        sample.utilization = 0.5  # type: ignore[misc]


def test_energy_since_start_counts_from_the_first_reading(
    fake: FakeNvml, monitor: GpuMonitor
) -> None:
    fake.gpus[0].energy_mj += 2_500
    fake.gpus[1].energy_mj += 1
    first, second = monitor.sample()
    assert first.energy_since_start_joules == 2.5
    assert first.energy_joules == 987_656.821
    assert second.energy_since_start_joules == 0.001


def test_unsupported_query_leaves_only_its_field_none() -> None:
    gpus = two_gpus()
    gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"}
    gpus[1].unsupported = {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetName"}
    with GpuMonitor.start(nvml=FakeNvml(gpus).module()) as monitor:
        first, second = monitor.sample()
    assert first.power_usage_watts is None
    assert first.energy_joules is None
    assert first.energy_since_start_joules is None
    assert first.power_limit_watts == 700.0
    assert first.utilization == 0.37
    assert first.memory_used_bytes == 81_604_378_624
    assert second.memory_used_bytes is None
    assert second.memory_total_bytes is None
    assert second.name is None
    assert second.power_usage_watts == 75.001
    assert second.energy_joules == 0.005


def test_energy_baseline_taken_when_energy_first_reads(fake: FakeNvml) -> None:
    fake.gpus[0].unsupported = {"nvmlDeviceGetTotalEnergyConsumption"}
    with GpuMonitor.start(nvml=fake.module()) as monitor:
        assert monitor.sample()[0].energy_since_start_joules is None
        fake.gpus[0].unsupported = set()
        assert monitor.sample()[0].energy_since_start_joules == 0.0
        fake.gpus[0].energy_mj += 1_000
        assert monitor.sample()[0].energy_since_start_joules == 1.0


def test_a_gpu_whose_uuid_fails_is_left_out(fake: FakeNvml) -> None:
    fake.gpus[0].unsupported = {"nvmlDeviceGetUUID"}
    with GpuMonitor.start(nvml=fake.module()) as monitor:
        assert [sample.index for sample in monitor.sample()] == [1]


def test_bytes_from_older_bindings_are_decoded() -> None:
    gpus = two_gpus()
    gpus[0].uuid = b"GPU-00000000-1111-2222-3333-444444444444"
    gpus[0].name = b"Tesla T4"
    with GpuMonitor.start(nvml=FakeNvml(gpus).module()) as monitor:
        sample = monitor.sample()[0]
    assert sample.uuid == "GPU-00000000-1111-2222-3333-444444444444"
    assert sample.name == "Tesla T4"


@pytest.mark.parametrize(
    ("devices", "indices"),
    [
        ([1], [1]),
        (["GPU-00000000-1111-2222-3333-444444444444"], [0]),
        ({0, "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}, [0, 1]),
    ],
)
def test_devices_restrict_the_monitor(
    fake: FakeNvml, devices: list[int | str], indices: list[int]
) -> None:
    with GpuMonitor.start(devices, nvml=fake.module()) as monitor:
        assert [sample.index for sample in monitor.sample()] == indices


def test_no_selected_gpu_is_unavailable_and_shuts_down(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = GpuMonitor.start([7], nvml=fake.module())
    assert not monitor.available
    assert monitor.sample() == []
    assert fake.shutdown_calls == 1
    assert "no GPU matches 7" in caplog.text
    monitor.close()
    assert fake.shutdown_calls == 1


def test_init_failure_is_unavailable() -> None:
    fake = FakeNvml(two_gpus(), init_error=True)
    monitor = GpuMonitor.start(nvml=fake.module())
    assert not monitor.available
    assert monitor.sample() == []
    assert monitor.uuids == []
    monitor.close()
    assert fake.shutdown_calls == 0


def test_zero_gpus_is_unavailable() -> None:
    fake = FakeNvml([])
    monitor = GpuMonitor.start(nvml=fake.module())
    assert not monitor.available
    assert monitor.sample() == []
    assert fake.shutdown_calls == 1


def test_init_once_and_shutdown_once(fake: FakeNvml) -> None:
    monitor = GpuMonitor.start(nvml=fake.module())
    monitor.sample()
    monitor.sample()
    assert fake.init_calls == 1
    assert fake.shutdown_calls == 0
    monitor.close()
    monitor.close()
    assert fake.shutdown_calls == 1
    assert not monitor.available
    assert monitor.sample() == []


def test_sample_from_threads_while_closing(fake: FakeNvml) -> None:
    monitor = GpuMonitor.start(nvml=fake.module())
    results: list[int] = []

    def read() -> None:
        for _ in range(200):
            results.append(len(monitor.sample()))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    monitor.close()
    for thread in threads:
        thread.join()
    assert set(results) <= {0, 2}
    assert fake.shutdown_calls == 1


def test_start_uses_the_loader_seam(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_metrics, "_load_nvml", fake.module)
    with GpuMonitor.start() as monitor:
        assert len(monitor.sample()) == 2
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)


# --- which distribution provides ``pynvml`` -----------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("TENSORGATE_DISABLE_CUDA", raising=False)
    # the deprecated distribution's import hook, were it installed here
    monkeypatch.delitem(sys.modules, "_pynvml_redirector", raising=False)
    return monkeypatch


def _provide(monkeypatch: pytest.MonkeyPatch, providers: dict[str, list[str]]) -> None:
    """Install the distributions named in ``providers`` (module -> distributions giving it),
    as ``importlib.metadata.distribution`` finds them: by name, however it is spelled."""

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    installed = {normal(name) for names in providers.values() for name in names}

    def distribution(name: str) -> object:
        if normal(name) not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return object()

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


@pytest.mark.parametrize(
    "providers",
    [
        {"pynvml": ["pynvml"]},
        {"pynvml": ["nvidia-ml-py", "pynvml"]},
        # pynvml 13 no longer ships the module, only its import hook and pynvml_utils
        {"pynvml": ["nvidia-ml-py"], "pynvml_utils": ["pynvml"], "site-packages": ["pynvml"]},
    ],
)
def test_deprecated_distribution_is_not_imported(
    clean_env: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fake: FakeNvml,
    providers: dict[str, list[str]],
) -> None:
    _provide(clean_env, providers)
    clean_env.setitem(sys.modules, "pynvml", fake.module())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu_metrics._load_nvml() is None
        monitor = GpuMonitor.start()
    assert not monitor.available
    assert fake.init_calls == 0
    warned = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warned) == 2  # one from each _load_nvml call, nothing else
    assert "deprecated 'pynvml' distribution" in warned[0].getMessage()


def test_deprecated_import_hook_is_detected(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fake: FakeNvml
) -> None:
    """The hook module imported at start-up betrays the distribution even without metadata."""
    _provide(clean_env, {"pynvml": ["nvidia-ml-py"]})
    clean_env.setitem(sys.modules, "_pynvml_redirector", types.ModuleType("_pynvml_redirector"))
    clean_env.setitem(sys.modules, "pynvml", fake.module())
    assert gpu_metrics._load_nvml() is None
    assert "deprecated 'pynvml' distribution" in caplog.text


@pytest.mark.parametrize("name", ["nvidia-ml-py", "nvidia_ml_py", "NVIDIA-ML-PY"])
def test_nvidia_ml_py_is_imported(
    clean_env: pytest.MonkeyPatch, fake: FakeNvml, name: str
) -> None:
    _provide(clean_env, {"pynvml": [name], "numpy": ["numpy"]})
    module = fake.module()
    clean_env.setitem(sys.modules, "pynvml", module)
    assert gpu_metrics._load_nvml() is module


def test_no_provider_is_not_imported(
    clean_env: pytest.MonkeyPatch, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    _provide(clean_env, {"numpy": ["numpy"], "pynvml": ["someone-else"]})
    clean_env.setitem(sys.modules, "pynvml", fake.module())
    assert gpu_metrics._load_nvml() is None
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


def test_import_error_is_not_raised(clean_env: pytest.MonkeyPatch) -> None:
    _provide(clean_env, {"pynvml": ["nvidia-ml-py"]})
    clean_env.setitem(sys.modules, "pynvml", None)  # makes the import fail
    assert gpu_metrics._load_nvml() is None


def test_disable_cuda_switch_turns_metrics_off(
    monkeypatch: pytest.MonkeyPatch, fake: FakeNvml
) -> None:
    monkeypatch.setenv("TENSORGATE_DISABLE_CUDA", "1")
    _provide(monkeypatch, {"pynvml": ["nvidia-ml-py"]})
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    assert gpu_metrics._load_nvml() is None


def test_this_machine_degrades_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """On the real machine: no exception, no warning; without NVML, no GPU metrics."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nvml = gpu_metrics._load_nvml()
        monitor = GpuMonitor.start()
        samples = monitor.sample()
        monitor.close()
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    if nvml is None:
        assert not monitor.available
        assert samples == []
    else:  # a GPU machine with nvidia-ml-py: whatever NVML sees is labelled by UUID
        assert all(sample.uuid.startswith("GPU-") for sample in samples)
