"""Importing a python model's ``model.py`` and making its ``TensorgateModel`` object.

Every instance imports the file afresh under a module name of its own, so two instances (or
two versions, or a reload after the file changed) never share module state, and unloading
forgets the module. The file is compiled from source each time, never through ``__pycache__``:
nothing is written into the repository (poll mode would take a new ``.pyc`` for a change of
the model) and no stale bytecode is run after an edit. Messages name the model and
``<version>/model.py``, never the folder the repository lives in: they reach clients.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType

from server.errors import ModelLoadError
from server.host_paths import redact_paths

log = logging.getLogger(__name__)

#: The name model.py must give its model class.
CLASS_NAME = "TensorgateModel"
# next() on an itertools.count is atomic under the GIL: models load on several threads.
_MODULE_NUMBERS = itertools.count(1)


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles the file on every import, reading and writing no bytecode cache."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


@dataclass(frozen=True)
class ModelSource:
    """Where a python model's code lives, and how messages may call it."""

    model: str
    path: Path

    @property
    def label(self) -> str:
        """``<version>/<file>``: the part of the path a client may see."""
        return f"{self.path.parent.name}/{self.path.name}"

    def describe(self, exc: BaseException) -> str:
        """``Type: text`` of an exception from user code, with the version folder's host path
        (a user's own ``open()`` error would show it) shown as ``<model>/<version>`` and any
        other host path as ``<path>``."""
        folder = self.path.parent
        return redact_paths(f"{type(exc).__name__}: {exc}", folder, f"{self.model}/{folder.name}")

    def load_error(self, what: str, exc: BaseException) -> ModelLoadError:
        log.error("model '%s': %s %s", self.model, self.label, what, exc_info=exc)
        return ModelLoadError(
            f"unable to load model '{self.model}': {self.label} {what}: {self.describe(exc)}"
        )


def import_module(source: ModelSource) -> ModuleType:
    """Run ``model.py`` as a new module (registered in ``sys.modules`` while it is in use, as
    dataclasses and pickling expect); ``forget_module`` removes it."""
    name = f"_tensorgate_python_model_{next(_MODULE_NUMBERS)}"
    loader = _SourceOnlyLoader(name, str(source.path))
    spec = importlib.util.spec_from_file_location(name, source.path, loader=loader)
    if spec is None or spec.loader is None:
        raise ModelLoadError(
            f"unable to load model '{source.model}': {source.label} is not a Python file"
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code: the load fails,
        forget_module(module)  # even for sys.exit() at module level; the server goes on
        raise source.load_error("failed to import", exc) from exc
    return module


def forget_module(module: ModuleType) -> None:
    sys.modules.pop(module.__name__, None)


def model_class(module: ModuleType, source: ModelSource) -> type:
    """The module's ``TensorgateModel`` class, which must have an ``execute`` method."""
    cls = getattr(module, CLASS_NAME, None)
    if not isinstance(cls, type):
        raise ModelLoadError(
            f"unable to load model '{source.model}': {source.label} must define a class named "
            f"{CLASS_NAME}"
        )
    if not callable(getattr(cls, "execute", None)):
        raise ModelLoadError(
            f"unable to load model '{source.model}': class {CLASS_NAME} in {source.label} has "
            "no execute(inputs) method"
        )
    return cls
