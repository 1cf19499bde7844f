"""Initial state data files: read from the model's initial_state folder, checked for size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.repository.initial_state import read_initial_states

STATE = (
    'name: "m" sequence_batching {{ state [ {{ input_name: "S" output_name: "T" '
    "data_type: TYPE_FP32 dims: [ 2 ] initial_state [ {{ data_type: TYPE_FP32 dims: [ 2 ] "
    '{data} }} ] }} ] }}'
)


def _config(data: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(STATE.format(data=data), config)
    return config


def test_a_data_file_is_read_as_the_states_values(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(np.array([1.5, -2], "<f4").tobytes())
    states = read_initial_states(_config('data_file: "s.bin"'), tmp_path)
    assert list(states) == ["S"]
    assert states["S"].dtype == np.float32 and states["S"].tolist() == [1.5, -2.0]


def test_zero_data_needs_no_file(tmp_path: Path) -> None:
    assert read_initial_states(_config("zero_data: true"), tmp_path) == {}


@pytest.mark.parametrize(
    "data, contents, message",
    [
        ('data_file: "missing.bin"', None, "names data_file 'initial_state/missing.bin', which"),
        ('data_file: "s.bin"', bytes(4), "expects 8 bytes in 'initial_state/s.bin', which has 4"),
        ('data_file: "../s.bin"', b"", "resolves outside the model's initial_state folder"),
    ],
)
def test_bad_data_files_fail_the_load(
    tmp_path: Path, data: str, contents: bytes | None, message: str
) -> None:
    (tmp_path / "initial_state").mkdir()
    if contents is not None:
        (tmp_path / "initial_state" / "s.bin").write_bytes(contents)
    with pytest.raises(ModelLoadError) as caught:
        read_initial_states(_config(data), tmp_path)
    assert message in caught.value.message, caught.value.message
