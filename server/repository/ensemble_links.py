"""Joins ensembles to their composing models: load order, dependency errors, unloading.

An ensemble is loaded after its composing models, as in Triton: in explicit mode loading an
ensemble loads the composing models not loaded yet; when every model loads at start, an
ensemble waits for its composing models' loads. Their completed configs are then checked
against the ensemble's (``ensemble_config.link``) before it serves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from server.errors import InferenceServerError, ModelLoadError, Unavailable
from server.generated import model_config_pb2 as mc
from server.repository import ensemble_config
from server.repository.loader import Model, State
from server.scheduling.ensemble import EnsembleScheduler, StepResult, StepRunner

if TYPE_CHECKING:
    from server.repository.manager import ModelRepository


class EnsembleLinker:
    """The ensemble side of a ``ModelRepository``."""

    def __init__(self, repository: ModelRepository) -> None:
        self._repository = repository
        #: set by the data plane: sends a step's internal request to a composing model
        self.step_runner: StepRunner | None = None

    async def link(self, model: Model, chain: tuple[str, ...]) -> None:
        """Make the ensemble's LOADING versions READY, or UNAVAILABLE with Triton's reason."""
        config = model.config
        assert config is not None
        started = time.perf_counter_ns()
        try:
            await self._load_composing(config, chain)
            plan = ensemble_config.link(config, self._composing_config)
        except InferenceServerError as exc:
            for served in model.versions.values():
                served.state, served.reason = State.UNAVAILABLE, exc.message
            return
        for served in model.versions.values():
            served.scheduler = EnsembleScheduler(plan, self._run_step, served.stats)
            served.stats.load_ns = time.perf_counter_ns() - started
            served.state = State.READY

    async def _load_composing(self, config: mc.ModelConfig, chain: tuple[str, ...]) -> None:
        repository = self._repository
        name = config.name
        wanted: dict[str, set[int]] = {}
        for model_name, version in ensemble_config.composing_models(config):
            wanted.setdefault(model_name, set()).add(version)
        missing = sorted(
            m for m in wanted if m not in repository.models and repository.folder(m) is None
        )
        if missing:
            raise ModelLoadError(
                f"ensemble {name} contains models that are not available or ambiguous: "
                + ", ".join(missing)
            )
        for model_name, versions in wanted.items():
            if model_name in chain:
                raise ModelLoadError(
                    f"circular dependency between ensembles: {name} -> ... -> {model_name} -> "
                    f"{name}"
                )
            composing = await self._ensure_loaded(model_name, chain)
            if not composing.ready_versions():
                reason = _reason(composing)
                if reason:
                    raise ModelLoadError(
                        f"ensemble '{name}' depends on '{model_name}' which has no loaded "
                        f"version. Model '{model_name}' loading failed with error: {reason}"
                    )
                raise ModelLoadError(
                    f"ensemble '{name}' depends on '{model_name}' which has no loaded version."
                )
            for version in sorted(versions):
                if version >= 0 and version not in composing.ready_versions():
                    raise ModelLoadError(
                        f"ensemble '{name}' depends on '{model_name}' whose required version "
                        f"{version} is not loaded."
                    )

    async def _ensure_loaded(self, name: str, chain: tuple[str, ...]) -> Model:
        """The composing model, loaded (or its load under way waited for) if need be."""
        repository = self._repository
        if repository.is_loading(name):
            await repository.wait_loaded(name)
        elif name not in repository.models or not repository.is_wanted(name):
            path = repository.folder(name)
            if path is not None:
                return await repository.load_dependency(name, path, chain)
        return repository.model(name)

    def _composing_config(self, name: str, version: int) -> mc.ModelConfig:
        model = self._repository.model(name)
        number = version if version >= 0 else model.ready_versions()[-1]
        config = model.versions[number].config or model.config
        assert config is not None
        return config

    def released_by(self, ensemble: str) -> list[str]:
        """The composing models ``unload_dependents`` takes with ``ensemble`` (just unloaded):
        not loaded by name, and in no other ensemble that is still wanted."""
        repository = self._repository
        model = repository.models.get(ensemble)
        if model is None or model.config is None or not ensemble_config.is_ensemble(model.config):
            return []
        still_used = {
            composing
            for name, other in repository.models.items()
            if name != ensemble and repository.is_wanted(name) and other.config is not None
            and ensemble_config.is_ensemble(other.config)
            for composing, _ in ensemble_config.composing_models(other.config)
        }
        names = dict.fromkeys(m for m, _ in ensemble_config.composing_models(model.config))
        return [
            name
            for name in names
            if repository.is_wanted(name) and not repository.is_explicit(name)
            and name not in still_used
        ]

    async def _run_step(
        self,
        model_name: str,
        model_version: str,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        request_id: str,
        parameters: Mapping[str, Any],
    ) -> StepResult:
        if self.step_runner is None:
            raise Unavailable("the server is not serving requests yet")
        return await self.step_runner(
            model_name, model_version, inputs, output_names, request_id, parameters
        )


def _reason(model: Model) -> str:
    reasons = [model.reason] if model.reason else []
    reasons += [v.reason for v in model.versions.values() if v.state is not State.READY and v.reason]
    return "; ".join(reasons)
