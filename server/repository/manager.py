"""The set of served models, found in the repository folders and loaded at start.

Lookups raise Triton's errors: an unknown model name is a 400, an unknown or unready version a
404. (Loading and unloading while serving arrive with the model lifecycle issue.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from backends.base import Backend
from server.errors import InvalidArgument, NotFound
from server.repository.loader import Model, ModelVersion, State, load_model
from server.repository.versions import parse_version
from server.settings import Settings

log = logging.getLogger(__name__)


def _unknown_model(name: str) -> InvalidArgument:
    return InvalidArgument(f"Request for unknown model: '{name}' is not found")


def scan_repositories(paths: tuple[str, ...]) -> dict[str, Path]:
    """Model folders by name; a name found in two repositories is an error, as in Triton."""
    found: dict[str, Path] = {}
    for repository in paths:
        root = Path(repository)
        if not root.is_dir():
            raise NotFound(f"failed to stat model repository path '{repository}'")
        for entry in sorted(root.iterdir()):
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            if entry.name in found:
                raise InvalidArgument(
                    f"model '{entry.name}' appears in multiple model repositories"
                )
            found[entry.name] = entry
    return found


class ModelRepository:
    """Holds every model of the repositories and answers which version serves a request."""

    def __init__(self, settings: Settings, backends: Mapping[str, Backend]) -> None:
        self._settings = settings
        self._backends = dict(backends)
        self._models: dict[str, Model] = {}

    async def load_all(self) -> None:
        """Scan the repositories and load every model, one at a time off the event loop
        (ONNX Runtime session creation is not safe to run concurrently)."""
        folders = scan_repositories(self._settings.model_repositories)
        for name, path in folders.items():
            self._models[name] = await asyncio.to_thread(
                load_model, path, self._backends, self._settings
            )

    @property
    def models(self) -> dict[str, Model]:
        return self._models

    def failed_models(self) -> list[Model]:
        """Models that are not fully ready (their reasons say why)."""
        return [model for model in self._models.values() if not model.ready]

    def all_ready(self) -> bool:
        return all(model.ready for model in self._models.values())

    def model(self, name: str) -> Model:
        model = self._models.get(name)
        if model is None:
            raise _unknown_model(name)
        return model

    def version(self, name: str, version: str) -> ModelVersion:
        """The READY version serving ``name``/``version`` ("" = the newest ready version)."""
        model = self.model(name)
        if not version:
            ready = model.ready_versions()
            if not ready:
                raise NotFound(f"Request for unknown model: '{name}' has no available versions")
            return model.versions[ready[-1]]
        number = parse_version(version)
        found = model.versions.get(number) if number is not None else None
        if found is None or found.state is not State.READY:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return found

    def is_ready(self, name: str, version: str) -> bool:
        model = self._models.get(name)
        if model is None:
            return False
        if not version:
            return bool(model.ready_versions())
        number = parse_version(version)
        found = model.versions.get(number) if number is not None else None
        return found is not None and found.state is State.READY

    def close(self) -> None:
        for model in self._models.values():
            for version in model.versions.values():
                if version.scheduler is not None:
                    version.scheduler.close()
                    version.scheduler = None
                version.state = State.UNAVAILABLE
