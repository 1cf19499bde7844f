"""The ``initial_state`` data files of a model's implicit states, read once at load.

A state's ``initial_state { data_file: "f" }`` names ``<model>/initial_state/f``: the state's
elements as raw little-endian values of its datatype (Triton's layout), exactly as many as the
state's dims hold. ``zero_data`` needs no file (the state starts from zeros either way).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol.datatypes import from_config_enum
from server.repository.paths import confined_file

INITIAL_STATE_FOLDER = "initial_state"


def read_initial_states(config: mc.ModelConfig, model_dir: Path) -> dict[str, np.ndarray]:
    """Each state's initial value from its data file, by the state's input name, shaped as
    the state's dims (without the batch dimension)."""
    found: dict[str, np.ndarray] = {}
    if not config.HasField("sequence_batching"):
        return found
    for state in config.sequence_batching.state:
        for initial in state.initial_state:
            if initial.WhichOneof("state_data") != "data_file":
                continue
            filename = initial.data_file
            label = f"{INITIAL_STATE_FOLDER}/{filename}"
            what = f"initial_state of state '{state.input_name}'"
            path = confined_file(
                model_dir / INITIAL_STATE_FOLDER, filename, what, config.name, label,
                "the model's initial_state folder",
            )
            if path is None:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': {what} names data_file '{label}', "
                    "which does not exist"
                )
            datatype = from_config_enum(state.data_type)
            elements = int(np.prod(tuple(state.dims), dtype=np.int64))
            raw = path.read_bytes()
            if len(raw) != elements * datatype.itemsize:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': {what} expects "
                    f"{elements * datatype.itemsize} bytes in '{label}', which has {len(raw)}"
                )
            values = np.frombuffer(raw, dtype=datatype.dtype.newbyteorder("<"), count=elements)
            found[state.input_name] = values.astype(datatype.dtype).reshape(tuple(state.dims))
    return found
