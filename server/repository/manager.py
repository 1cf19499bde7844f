"""The served models and their lifecycle: load, reload, unload, index, and polling.

Lookups raise Triton's errors: an unknown model name is a 400, an unknown or unready version a
404. A reload keeps the old versions serving until the new ones are READY and then switches in
one step; a replaced or unloaded version refuses new requests (503) and is closed once the
requests it admitted have been answered.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.base import Backend
from server.errors import InvalidArgument, ModelLoadError, NotFound, Unavailable
from server.generated import model_config_pb2 as mc
from server.repository import ensemble_config
from server.repository.ensemble_links import EnsembleLinker
from server.repository.loader import Model, ModelVersion, State, load_model
from server.repository.overrides import OverrideFolder, check_model_name
from server.repository.versions import request_version
from server.settings import Settings

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int, int], ...]


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


def fingerprint(model_dir: Path) -> Fingerprint:
    """What poll mode compares to see a model changed: every file's path, size and mtime."""
    entries = []
    for folder, _, files in os.walk(model_dir):
        for name in files:
            path = Path(folder, name)
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((str(path.relative_to(model_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


@dataclass
class _Loaded:
    """A model as last loaded: its versions, where it came from, what it looked like."""

    model: Model
    fingerprint: Fingerprint
    override: OverrideFolder | None = None


class ModelRepository:
    """Holds the models and answers which version serves a request."""

    def __init__(self, settings: Settings, backends: Mapping[str, Backend]) -> None:
        self._settings = settings
        self._backends = dict(backends)
        self._loaded: dict[str, _Loaded] = {}
        self._wanted: set[str] = set()  # models that should be serving (readiness)
        self._loading: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        #: models loaded by name (not only as an ensemble's composing model)
        self._explicit: set[str] = set()
        #: ensembles unloaded because a composing model was (whether they were loaded by
        #: name): they load again once all their composing models are back, as in Triton
        self._parked: dict[str, bool] = {}
        #: runs ensembles' steps; its ``step_runner`` is set by the data plane
        self.ensembles = EnsembleLinker(self)

    # --- lookups -----------------------------------------------------------------------------

    @property
    def models(self) -> dict[str, Model]:
        return {name: loaded.model for name, loaded in self._loaded.items()}

    def failed_models(self) -> list[Model]:
        """Wanted models that are not fully ready (their reasons say why)."""
        return [
            loaded.model
            for name, loaded in self._loaded.items()
            if name in self._wanted and not loaded.model.ready
        ]

    def all_ready(self) -> bool:
        """Every model that should be loaded is READY. A model reloading keeps its serving
        versions meanwhile, so it stays ready; one loading for the first time is not yet."""
        return all(
            name in self._loaded and self._loaded[name].model.ready for name in self._wanted
        )

    def model(self, name: str) -> Model:
        loaded = self._loaded.get(name)
        if loaded is None:
            raise _unknown_model(name)
        return loaded.model

    def version(self, name: str, version: str) -> ModelVersion:
        """The READY version serving ``name``/``version`` ("" = the newest ready version)."""
        number = request_version(version)
        model = self.model(name)
        if number is None:
            newest = model.newest_ready()
            if newest is None:
                if any(v.state is State.UNLOADING for v in model.versions.values()):
                    raise Unavailable(f"model '{name}' is being unloaded")
                raise NotFound(f"Request for unknown model: '{name}' has no available versions")
            return newest
        found = model.versions.get(number)
        if found is not None and found.state is State.UNLOADING:
            raise Unavailable(f"model '{name}' version {number} is being unloaded")
        if found is None or found.state is not State.READY:
            raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
        return found

    def is_ready(self, name: str, version: str) -> bool:
        """Whether that version is READY; a version string that is no number is refused."""
        request_version(version)
        try:
            self.version(name, version)  # only READY versions are returned
            return True
        except (InvalidArgument, NotFound, Unavailable):
            return False

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        """Triton's repository index: one entry per loaded version, name-only entries for
        models in the folders that were never loaded; only READY ones with ``ready_only``."""
        entries: list[dict[str, Any]] = []
        names = set(self._loaded) | self._loading | set(self._folders(strict=False))
        for name in sorted(names):
            loaded = self._loaded.get(name)
            if name in self._loading and (loaded is None or not loaded.model.versions):
                if not ready_only:
                    entries.append({"name": name, "state": State.LOADING.value})
                continue
            if loaded is None:
                if not ready_only:
                    entries.append({"name": name})
                continue
            model = loaded.model
            if not model.versions and not ready_only:
                entries.append(
                    {"name": name, "state": State.UNAVAILABLE.value, "reason": model.reason}
                )
            for number, served in sorted(model.versions.items()):
                if ready_only and served.state is not State.READY:
                    continue
                entries.append(
                    {
                        "name": name,
                        "version": str(number),
                        "state": served.state.value,
                        "reason": served.reason,
                    }
                )
        return entries

    # --- lifecycle ----------------------------------------------------------------------------

    def _folders(self, strict: bool = True) -> dict[str, Path]:
        try:
            return scan_repositories(self._settings.model_repositories)
        except (NotFound, InvalidArgument):
            if strict:
                raise
            return {}

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load_initial(self, names: Iterable[str] | None = None) -> None:
        """Load ``names`` (None: every model in the repositories), several at once.
        Failures are recorded in the models' states, not raised."""
        folders = self._folders()
        wanted = list(folders) if names is None else list(names)
        for name in wanted:
            if name not in folders:
                raise ModelLoadError(
                    f"failed to load '{name}', failed to poll from model repository"
                )
        self._explicit.update(wanted)
        await asyncio.gather(*(self._load(name, folders[name]) for name in wanted))

    async def load(
        self,
        name: str,
        config_override: mc.ModelConfig | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load or reload ``name`` (from its folder, or from ``files`` in a private folder);
        raises when it does not load, in which case a serving old version keeps serving."""
        check_model_name(name)
        # Model files can be large: written (and later removed) on a worker thread.
        override = await asyncio.to_thread(OverrideFolder, name, files) if files else None
        if override is not None:
            path = override.model_dir
        else:
            path_or_none = self._folders().get(name)
            if path_or_none is None:
                raise ModelLoadError(
                    f"failed to load '{name}', failed to poll from model repository"
                )
            path = path_or_none
        self._explicit.add(name)
        model = await self._load(name, path, config_override, override, strict=True)
        if not model.ready:
            raise ModelLoadError(f"failed to load '{name}': {_failure(model)}")

    async def _load(
        self,
        name: str,
        path: Path,
        config_override: mc.ModelConfig | None = None,
        override: OverrideFolder | None = None,
        strict: bool = False,
        chain: tuple[str, ...] = (),
    ) -> Model:
        """``chain``: the ensembles whose loading led here (to refuse circular ones)."""
        model = await self._load_locked(name, path, config_override, override, strict, chain)
        if model.ready:
            await self._unpark_ensembles(name)
        return model

    async def _load_locked(
        self,
        name: str,
        path: Path,
        config_override: mc.ModelConfig | None,
        override: OverrideFolder | None,
        strict: bool,
        chain: tuple[str, ...],
    ) -> Model:
        async with self._lock(name):
            self._parked.pop(name, None)
            self._wanted.add(name)
            self._loading.add(name)
            try:
                seen = await asyncio.to_thread(fingerprint, path)
                model = await asyncio.to_thread(
                    load_model, path, self._backends, self._settings, config_override
                )
                if model.config is not None and ensemble_config.is_ensemble(model.config):
                    await self.ensembles.link(model, (*chain, name))
            finally:
                self._loading.discard(name)
            previous = self._loaded.get(name)
            if strict and not model.ready and previous is not None and previous.model.ready:
                # A failed reload: the serving versions stay; the new attempt is dropped.
                await _retire(model)
                if override is not None:
                    await asyncio.to_thread(override.remove)
                log.error("reload of '%s' failed; the serving versions stay: %s", name, _failure(model))
                return model
            self._loaded[name] = _Loaded(model, seen, override)
            if previous is not None:
                await _retire(previous.model)
                if previous.override is not None:
                    await asyncio.to_thread(previous.override.remove)
            return model

    async def unload(self, name: str, dependents: bool = False) -> None:
        """Stop serving ``name``: new requests are refused, admitted ones are answered, then
        its instances are released. Unloading a model that is not loaded does nothing.
        ``dependents`` (``unload_dependents``): an ensemble's composing models go too, those
        not loaded by name and used by no other ensemble still wanted. Ensembles that use
        ``name`` become unavailable too (Triton unloads them), until it is back."""
        if self._parked.pop(name, None) is not None:
            await self._drop_override(name)
        await self._unload(name)
        await self._park_ensembles(name)
        if dependents:
            for composing in self.ensembles.released_by(name):
                await self.unload(composing, dependents=True)

    def is_wanted(self, name: str) -> bool:
        """Whether ``name`` should be serving (loaded and not unloaded since)."""
        return name in self._wanted

    def is_explicit(self, name: str) -> bool:
        """Whether ``name`` was loaded by name, not only as a composing model."""
        return name in self._explicit

    def is_loading(self, name: str) -> bool:
        return name in self._loading

    def folder(self, name: str) -> Path | None:
        """The model's folder in the repositories, if it has one."""
        return self._folders(strict=False).get(name)

    async def load_dependency(self, name: str, path: Path, chain: tuple[str, ...]) -> Model:
        """Load a composing model for the ensemble being loaded (``chain``'s last)."""
        return await self._load(name, path, chain=chain)

    async def wait_loaded(self, name: str) -> None:
        """Wait until a load of ``name`` under way has finished."""
        async with self._lock(name):
            pass

    async def _park_ensembles(self, name: str) -> None:
        """Unload the ensembles that use ``name`` (just unloaded), remembering them."""
        for ensemble in self._ensembles_using(name, self._wanted):
            log.error(
                "ensemble '%s' depends on '%s' which has no loaded version.", ensemble, name
            )
            explicit = ensemble in self._explicit
            await self._unload(ensemble, keep_files=True)
            self._parked[ensemble] = explicit
            await self._park_ensembles(ensemble)  # an ensemble in an ensemble

    async def _unpark_ensembles(self, name: str) -> None:
        """Load again the parked ensembles that ``name`` (just loaded) completes."""
        for ensemble in self._ensembles_using(name, self._parked):
            loaded = self._loaded[ensemble]
            assert loaded.model.config is not None
            composing = {m for m, _ in ensemble_config.composing_models(loaded.model.config)}
            if not all(self.is_wanted(m) and self.model(m).ready_versions() for m in composing):
                continue
            if self._parked.pop(ensemble):
                self._explicit.add(ensemble)
            override, loaded.override = loaded.override, None  # handed to the new load
            log.info("ensemble '%s': its composing models are back, loading it", ensemble)
            await self._load(ensemble, loaded.model.path, override=override)

    def _ensembles_using(self, name: str, among: Iterable[str]) -> list[str]:
        found = []
        for ensemble in list(among):
            loaded = self._loaded.get(ensemble)
            config = None if loaded is None else loaded.model.config
            if config is not None and ensemble_config.is_ensemble(config) and any(
                m == name for m, _ in ensemble_config.composing_models(config)
            ):
                found.append(ensemble)
        return found

    async def _drop_override(self, name: str) -> None:
        loaded = self._loaded.get(name)
        if loaded is not None and loaded.override is not None:
            await asyncio.to_thread(loaded.override.remove)
            loaded.override = None

    async def _unload(self, name: str, keep_files: bool = False) -> None:
        """``keep_files``: keep a private override folder (the model may load again)."""
        async with self._lock(name):
            self._explicit.discard(name)
            self._wanted.discard(name)
            loaded = self._loaded.get(name)
            if loaded is None:
                return
            for served in loaded.model.versions.values():
                if served.state is State.READY:
                    served.state = State.UNLOADING
            await _retire(loaded.model)
            for served in loaded.model.versions.values():
                served.state = State.UNAVAILABLE
                served.reason = "unloaded"
            if loaded.override is not None and not keep_files:
                await asyncio.to_thread(loaded.override.remove)
                loaded.override = None
            log.info("unloaded '%s'", name)

    async def poll_once(self) -> None:
        """Poll mode: load new models, reload changed ones, unload removed ones."""
        folders = self._folders(strict=False)
        for name, path in folders.items():
            loaded = self._loaded.get(name)
            if name in self._parked:
                continue  # loads again when its composing models do
            if name not in self._wanted:  # new, or back after it was removed
                log.info("new model '%s': loading", name)
            elif loaded is not None and loaded.override is None:
                changed = await asyncio.to_thread(fingerprint, path) != loaded.fingerprint
                if not changed:
                    continue
                log.info("model '%s' changed: reloading", name)
            else:
                continue
            await self._load(name, path, strict=True)
        for name in list(self._wanted):
            if name not in folders:
                log.info("model '%s' removed from the repository: unloading", name)
                await self.unload(name)
        for name in [n for n in self._parked if n not in folders]:
            del self._parked[name]  # an ensemble waiting for its models, gone itself

    async def close(self, wait_secs: float | None = None) -> None:
        """Release every model (server shutdown), waiting at most ``wait_secs`` for requests
        still running (None: as long as they take)."""
        for loaded in list(self._loaded.values()):
            await _retire(loaded.model, wait_secs)
            if loaded.override is not None:
                await asyncio.to_thread(loaded.override.remove)


def _failure(model: Model) -> str:
    reasons = [model.reason] if model.reason else []
    reasons += [
        f"version {number}: {served.reason}"
        for number, served in sorted(model.versions.items())
        if served.state is not State.READY
    ]
    return "; ".join(reasons) or "no version loaded"


async def _retire(model: Model, wait_secs: float | None = None) -> None:
    """Close every version to new requests, wait for those admitted (at most ``wait_secs``;
    None: as long as they take), release the instances."""
    for served in model.versions.values():
        served.gate.close()
    for served in model.versions.values():
        idle = await served.gate.wait_idle(60 if wait_secs is None else wait_secs)
        while not idle and wait_secs is None:
            log.warning(
                "still waiting for %d requests to '%s' version %d before releasing it",
                served.gate.inside, model.name, served.version,
            )
            idle = await served.gate.wait_idle(60)
        if served.scheduler is not None:
            # Idle: each instance is released on its own worker thread (a slow release does
            # not stall serving); forced: the threads are left to finish on their own.
            scheduler, served.scheduler = served.scheduler, None
            if idle:
                await scheduler.aclose()
            else:
                scheduler.close(wait=False)
