"""The label files of a model's outputs (``label_filename``), read once when the model loads.

A label file is in the model's folder, one label per line; line ``i`` names class ``i`` of a
classification (see ``server.protocol.classification``). Lines are kept as bytes, as Triton
keeps them: only the newline ends a line, and the last line needs none.
"""

from __future__ import annotations

from pathlib import Path

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.repository.paths import confined_file

#: A label file larger than this is refused (it is read into memory whole).
MAX_LABEL_FILE_BYTES = 64 << 20


def read_labels(config: mc.ModelConfig, model_dir: Path) -> dict[str, tuple[bytes, ...]]:
    """Output name -> its labels, for every output with a ``label_filename``. Triton fails the
    load when a label file is missing; so does this, also for one outside the model folder."""
    labels: dict[str, tuple[bytes, ...]] = {}
    for output in config.output:
        name = output.label_filename
        if not name:
            continue
        what = f"label file of output '{output.name}'"
        path = confined_file(model_dir, name, what, config.name, name, "the model's folder")
        if path is None:
            raise ModelLoadError(
                f"unable to load model '{config.name}': label file '{name[:200]}' of output "
                f"'{output.name}' not found"
            )
        labels[output.name] = _lines(path, what, config.name, name)
    return labels


def _lines(path: Path, what: str, model: str, name: str) -> tuple[bytes, ...]:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_LABEL_FILE_BYTES + 1)
    except OSError as exc:
        raise ModelLoadError(
            f"unable to load model '{model}': {what} '{name[:200]}' cannot be read: "
            f"{exc.strerror}"
        ) from None
    if len(data) > MAX_LABEL_FILE_BYTES:
        raise ModelLoadError(
            f"unable to load model '{model}': {what} '{name[:200]}' is larger than "
            f"{MAX_LABEL_FILE_BYTES} bytes"
        )
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return tuple(lines)
