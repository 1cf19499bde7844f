"""Importing a python model's ``model.py`` and making its ``TensorgateModel`` object.

Every instance imports the file afresh under a module name of its own, so two instances (or
two versions, or a reload after the file changed) never share module state, and unloading
forgets the module. The file is compiled from source each time, never through ``__pycache__``:
nothing is written into the repository (poll mode would take a new ``.pyc`` for a change of
the model) and no stale bytecode is run after an edit. Messages name the model and
``<version>/model.py``, never the folder the repository lives in: they reach clients.
"""

from __future__ import annotations

import ast
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

#: The name model.py gives its model class: ours, or Triton's.
CLASS_NAME = "TensorgateModel"
TRITON_CLASS_NAME = "TritonPythonModel"
#: The module Triton's models import their helpers from.
UTILS_MODULE = "triton_python_backend_utils"
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


def provide_utils_module() -> None:
    """Make ``import triton_python_backend_utils`` work in model code: the top-level module of
    that name when it can be imported, else ``backends.python.pb_utils`` under its name."""
    if UTILS_MODULE in sys.modules:
        return
    try:
        importlib.import_module(UTILS_MODULE)
    except ImportError:
        sys.modules.setdefault(UTILS_MODULE, importlib.import_module("backends.python.pb_utils"))


def import_module(source: ModelSource) -> ModuleType:
    """Run ``model.py`` as a new module (registered in ``sys.modules`` while it is in use, as
    dataclasses and pickling expect); ``forget_module`` removes it."""
    provide_utils_module()
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
    """The module's model class, which must have an ``execute`` method: ``TensorgateModel``
    (the native interface), else ``TritonPythonModel`` (Triton's; see ``triton_model``)."""
    for name in (CLASS_NAME, TRITON_CLASS_NAME):
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            break
    else:
        raise ModelLoadError(
            f"unable to load model '{source.model}': {source.label} must define a class named "
            f"{CLASS_NAME} (or Triton's {TRITON_CLASS_NAME})"
        )
    if not callable(getattr(cls, "execute", None)):
        argument = "inputs" if name == CLASS_NAME else "requests"
        raise ModelLoadError(
            f"unable to load model '{source.model}': class {name} in {source.label} has "
            f"no execute({argument}) method"
        )
    return cls


def defines_triton_model(path: Path) -> bool:
    """Whether ``model.py`` defines ``class TritonPythonModel`` (and no ``TensorgateModel``) at
    its top level, read without running it: a KIND_GPU load decides by this whether it needs
    CUDA before any user code runs."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return False  # importing it reports the fault
    names = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    return TRITON_CLASS_NAME in names and CLASS_NAME not in names


def triton_class(module: ModuleType) -> type | None:
    """The module's ``TritonPythonModel`` when it has no ``TensorgateModel``, else None."""
    if isinstance(getattr(module, CLASS_NAME, None), type):
        return None
    cls = getattr(module, TRITON_CLASS_NAME, None)
    return cls if isinstance(cls, type) else None
