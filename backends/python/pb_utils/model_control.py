"""``load_model``, ``unload_model`` and ``is_model_ready`` for a model's ``execute``: the
server's repository API (explicit model control mode only, as for clients), called from the
model's thread through ``server_link``. A refusal raises ``TritonModelException`` with the
server's text."""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from backends.python.pb_utils.errors import TritonModelException
from backends.python.server_link import LINK
from server.errors import InferenceServerError

T = TypeVar("T")


def _wait(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        return LINK.wait(coroutine)
    except InferenceServerError as exc:
        raise TritonModelException(exc.message) from exc


def load_model(
    model_name: str, config: str = "", files: Mapping[str, bytes] | None = None
) -> None:
    """Load or reload ``model_name``, with ``config`` (JSON text) and ``files``
    (``"file:<version>/<name>": bytes``) overriding the repository's, as the load API does."""
    _wait(LINK.calls.load_model(model_name, config or None, dict(files or {})))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name``; ``unload_dependents`` takes an ensemble's composing models
    with it, as the repository API's parameter does."""
    _wait(LINK.calls.unload_model(model_name, unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether that model (version) is loaded and ready."""
    return bool(_wait(LINK.calls.model_ready(model_name, str(model_version))))
