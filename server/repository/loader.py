"""Turn one model folder into served versions: config, backend, versions, instances.

Runs on a worker thread (session creation is slow and must not block the event loop).
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.base import Backend, ModelInstance, Placement
from server.cuda.devices import device_count
from server.errors import InferenceServerError, ModelLoadError, to_server_error
from server.generated import model_config_pb2 as mc
from server.observability.statistics import ModelStats
from server.protocol.model_spec import ModelSpec
from server.protocol.sequence_spec import SequenceSpec
from server.repository import config as model_config
from server.repository import ensemble_config
from server.repository.autocomplete import autocomplete, is_complete
from server.repository.initial_state import read_initial_states
from server.repository.labels import read_labels
from server.repository.limits import check_limits
from server.repository.paths import confined_file
from server.repository.versions import available_versions, select_versions
from server.repository.warmup import NamedInstance, instance_names, run_warmup
from server.repository.warmup_data import build_samples
from server.request_gate import RequestGate
from server.scheduling.batcher import BatchingPolicy, DynamicBatcher
from server.scheduling.direct import DirectScheduler
from server.scheduling.job import Scheduler
from server.scheduling.layout import BatchLayout
from server.scheduling.sequence import SequenceBatcher
from server.settings import Settings

log = logging.getLogger(__name__)


class State(enum.Enum):
    """Triton's model version states (model_lifecycle.cc ModelReadyStateString)."""

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


_LOADS = itertools.count(1)  # next() is atomic under the GIL; versions load on threads


@dataclass
class ModelVersion:
    """One version of a model: its state and, when READY, the scheduler that runs it."""

    name: str
    version: int
    state: State
    reason: str = ""
    config: mc.ModelConfig | None = None
    spec: ModelSpec | None = None
    scheduler: Scheduler | None = None
    #: admits requests to this version; closed when it is unloaded or replaced
    gate: RequestGate = field(default_factory=RequestGate)
    stats: ModelStats = field(default_factory=ModelStats)
    #: which load made it (unique per process): keys the response cache, so a reload of the
    #: same version with new weights never answers from what the old one cached
    load: int = field(default_factory=lambda: next(_LOADS))


@dataclass
class Model:
    """A model folder: its completed config (None if it could not be made) and its versions."""

    name: str
    path: Path
    config: mc.ModelConfig | None = None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    reason: str = ""

    def ready_versions(self) -> list[int]:
        return sorted(v for v, mv in self.versions.items() if mv.state is State.READY)

    def newest_ready(self) -> ModelVersion | None:
        """The READY version with the highest number (what a request without one gets)."""
        newest, highest = None, -1
        for number, served in self.versions.items():
            if number > highest and served.state is State.READY:
                newest, highest = served, number
        return newest

    @property
    def ready(self) -> bool:
        """Every version the policy asked for is serving (and there is at least one)."""
        return bool(self.versions) and all(mv.state is State.READY for mv in self.versions.values())


def _resolve_backend(
    config: mc.ModelConfig, model_dir: Path, versions: list[int], backends: Mapping[str, Backend]
) -> Backend:
    """Pick the backend as Triton's AutoCompleteBackendFields does, and fill its fields."""
    chosen: Backend | None = None
    if config.backend:
        chosen = backends.get(config.backend)
        if chosen is None:
            raise ModelLoadError(
                f"unsupported backend '{config.backend}' for model '{config.name}'"
            )
    elif config.platform:
        chosen = next((b for b in backends.values() if b.platform == config.platform), None)
        if chosen is None:
            raise ModelLoadError(
                f"unsupported platform '{config.platform}' for model '{config.name}'"
            )
    else:
        for backend in backends.values():
            filename = config.default_model_filename or backend.default_model_filename
            if any(model_file(model_dir, v, filename, config.name) for v in versions):
                chosen = backend
                break
    if chosen is None:
        files = " or ".join(f"<version>/{b.default_model_filename}" for b in backends.values())
        raise ModelLoadError(
            f"unable to find a backend for model '{config.name}': set 'backend' or 'platform' "
            f"in config.pbtxt, or provide {files}"
        )
    if config.platform and config.platform != chosen.platform:
        raise ModelLoadError(
            f"platform '{config.platform}' does not match backend '{chosen.name}' for model "
            f"'{config.name}'"
        )
    config.backend = chosen.name
    config.platform = chosen.platform
    if not config.default_model_filename:
        config.default_model_filename = chosen.default_model_filename
    return chosen


def model_file(model_dir: Path, version: int, filename: str, model: str) -> Path | None:
    """The model file of one version, checked to resolve inside its version folder and be a
    regular file (None if there is none)."""
    return confined_file(
        model_dir / str(version), filename, "model file", model, f"{version}/{filename}",
        "the model's version folder",
    )


def load_model(
    model_dir: Path,
    backends: Mapping[str, Backend],
    settings: Settings,
    config_override: mc.ModelConfig | None = None,
    gpu_count: int | None = None,
) -> Model:
    """Load every version the policy selects; failures are recorded, not raised.
    ``config_override`` replaces the folder's ``config.pbtxt`` (load API); ``gpu_count``
    overrides the GPUs the model's backend says it can use."""
    model = Model(name=model_dir.name, path=model_dir)
    try:
        config, backend, versions = _prepare_config(
            model_dir, backends, settings, config_override, gpu_count
        )
        labels = read_labels(config, model_dir)  # a missing label file fails the load, as in Triton
        initial_states = read_initial_states(config, model_dir)
    except Exception as exc:  # a fault preparing one model fails that model alone
        error = to_server_error(exc)
        model.reason = error.message
        trace = None if isinstance(exc, InferenceServerError) else exc  # a bug: its traceback
        log.error("failed to load model '%s': %s", model.name, error.message, exc_info=trace)
        return model
    model.config = config
    _check_response_cache(config, settings)
    for version in versions:
        if backend is None:  # an ensemble: linked to its composing models by the manager
            model.versions[version] = _ensemble_version(config, version, labels)
        else:
            model.versions[version] = _load_version(
                model_dir, version, config, backend, labels, initial_states
            )
    if not versions:
        model.reason = f"no version folder to load for model '{model.name}'"
        log.error("failed to load model '%s': %s", model.name, model.reason)
    return model


def _check_response_cache(config: mc.ModelConfig, settings: Settings) -> None:
    """A model asking for the response cache loads either way (as in Triton), but is told
    when its answers will not be cached."""
    if not config.response_cache.enable:
        return
    if settings.response_cache_byte_size is None:
        log.warning(
            "model '%s' enables the response cache, but no cache is configured "
            "(--cache-config local,size=BYTES): its responses are not cached", config.name
        )
    elif config.model_transaction_policy.decoupled:
        log.warning(
            "model '%s' enables the response cache, but it is decoupled: its responses "
            "are not cached", config.name
        )


def _prepare_config(
    model_dir: Path,
    backends: Mapping[str, Backend],
    settings: Settings,
    config_override: mc.ModelConfig | None,
    gpu_count: int | None,
) -> tuple[mc.ModelConfig, Backend | None, list[int]]:
    """The completed config, its backend (None for an ensemble) and the versions to load."""
    if config_override is not None:
        config = mc.ModelConfig()
        config.CopyFrom(config_override)
    else:
        config = model_config.read_config(model_dir, settings.model_config_name)
    if config.name and config.name != model_dir.name:
        raise ModelLoadError(
            f"unexpected directory name '{model_dir.name}' for model '{config.name}', directory "
            "name must equal model name"
        )
    config.name = model_dir.name
    check_limits(config)
    available = available_versions(model_dir)
    ensemble_config.validate_structure(config)
    if ensemble_config.is_ensemble(config):
        return _prepare_ensemble(config, available)
    backend = _resolve_backend(config, model_dir, available, backends)
    policy = config.version_policy if config.HasField("version_policy") else None
    versions = select_versions(policy or mc.ModelVersionPolicy(), available)
    present = [v for v in versions if v in available]
    if not settings.disable_auto_complete_config and present:
        _complete(config, backend, model_dir, present[-1], settings)
    if gpu_count is None:
        model_config.normalize(config, backend.gpu_count(), device_count())
    else:
        model_config.normalize(config, gpu_count)
    check_limits(config)  # again: autocomplete and the GPUs may have added to it
    model_config.validate(config)
    if config.model_transaction_policy.decoupled and not backend.supports_decoupled:
        raise ModelLoadError(
            f"model '{config.name}': model_transaction_policy {{ decoupled: true }} is not "
            f"supported by the {backend.name} backend yet"
        )
    return config, backend, versions


def _prepare_ensemble(
    config: mc.ModelConfig, available: list[int]
) -> tuple[mc.ModelConfig, None, list[int]]:
    """An ensemble has no backend, instances or model files: Triton leaves its instance
    groups and optimization unset (and refuses them), so only the version policy is filled."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    model_config.validate(config)
    return config, None, select_versions(config.version_policy, available)


def _ensemble_version(
    config: mc.ModelConfig, version: int, labels: Mapping[str, tuple[bytes, ...]]
) -> ModelVersion:
    """An ensemble version, LOADING until the manager links it to its composing models."""
    return ModelVersion(
        config.name,
        version,
        State.LOADING,
        config=config,
        spec=ModelSpec.from_config(config, labels),
        gate=RequestGate(f"model '{config.name}' version {version} is being unloaded"),
    )


def _complete(
    config: mc.ModelConfig, backend: Backend, model_dir: Path, version: int, settings: Settings
) -> None:
    """Auto-complete from the newest version's model file: by the model's own code where the
    backend has a way (a python model's ``auto_complete_config``, asked even of a complete
    config, as Triton does), else from its signature when the config lacks tensors."""
    try:
        path = model_file(model_dir, version, config.default_model_filename, config.name)
    except ModelLoadError:
        if is_complete(config):
            return  # loading that version reports it
        raise
    if path is not None and backend.complete_config(path, config):
        return
    if is_complete(config):
        return
    if path is None:
        raise ModelLoadError(
            f"unable to complete the config of model '{config.name}': model file "
            f"{version}/{config.default_model_filename} not found"
        )
    default_max = int(settings.backend_option(backend.name, "default-max-batch-size", "4"))
    autocomplete(config, backend.signature(path), default_max)


def _load_version(
    model_dir: Path,
    version: int,
    config: mc.ModelConfig,
    backend: Backend,
    labels: Mapping[str, tuple[bytes, ...]],
    initial_states: Mapping[str, np.ndarray],
) -> ModelVersion:
    """``labels``: the outputs' label files, ``initial_states`` the states' initial data
    files, read once for all versions."""
    result = ModelVersion(
        config.name,
        version,
        State.UNAVAILABLE,
        config=config,
        gate=RequestGate(f"model '{config.name}' version {version} is being unloaded"),
    )
    try:
        path = model_file(model_dir, version, config.default_model_filename, config.name)
    except ModelLoadError as exc:
        path, result.reason = None, exc.message
    else:
        if path is None:
            result.reason = f"model file {version}/{config.default_model_filename} not found"
    if path is None:
        log.error("failed to load '%s' version %d: %s", config.name, version, result.reason)
        return result
    instances: list[ModelInstance] = []
    started = time.perf_counter_ns()
    try:
        for group in config.instance_group:
            devices = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else [0]
            for device in devices:
                for _ in range(group.count):
                    placement = Placement(group.kind, device)
                    instances.append(backend.load_instance(path, config, placement))
        # after every instance exists, before any request can reach one (Triton's order)
        named = map(NamedInstance, instance_names(config), instances)
        run_warmup(config, build_samples(config, model_dir), list(named), result.stats)
    except Exception as exc:  # noqa: BLE001 - a backend's or a warmup sample's fault fails
        # this version only
        for instance in instances:
            instance.close()
        result.stats = ModelStats()  # what warmup counted before it failed goes too
        result.reason = to_server_error(exc).message
        log.error("failed to load '%s' version %d: %s", config.name, version, result.reason)
        return result
    result.spec = ModelSpec.from_config(config, labels)
    name = f"{config.name}-{version}"
    layout = BatchLayout.from_config(config)
    if config.HasField("sequence_batching"):
        result.scheduler = SequenceBatcher(
            name, instances, SequenceSpec.from_config(config, initial_states), result.stats,
            layout=layout, model=config.name,
        )
    elif config.HasField("dynamic_batching") and config.max_batch_size > 0:
        policy = BatchingPolicy.from_config(config)
        result.scheduler = DynamicBatcher(
            name, instances, policy, result.stats, layout=layout, model=config.name
        )
    else:
        result.scheduler = DirectScheduler(
            name, instances, result.stats, layout, model=config.name
        )
    result.stats.load_ns = time.perf_counter_ns() - started
    result.state = State.READY
    log.info("successfully loaded '%s' version %d", config.name, version)
    return result
