"""Unit tests for server.repository.warmup_data: a config's model_warmup samples as requests."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.repository.warmup_data import WarmupSample, build_samples


def _config(warmup: str, max_batch_size: int = 8) -> mc.ModelConfig:
    text = f'name: "m" max_batch_size: {max_batch_size}\n{warmup}'
    return text_format.Parse(text, mc.ModelConfig())


def _samples(
    tmp_path: Path, warmup: str, max_batch_size: int = 8, seed: int = 0
) -> list[WarmupSample]:
    config = _config(warmup, max_batch_size)
    return build_samples(config, tmp_path, np.random.default_rng(seed))


def _only_input(sample: WarmupSample) -> np.ndarray:
    (tensor,) = sample.request.inputs
    assert tensor.data.shape == tensor.shape
    return tensor.data


def test_zero_data_has_a_batch_dimension_when_the_model_batches(tmp_path: Path) -> None:
    (sample,) = _samples(tmp_path, """model_warmup { name: "w" batch_size: 3 count: 2
        inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 2, 4 ] zero_data: true } } }""")
    assert (sample.name, sample.batch_size, sample.count) == ("w", 3, 2)
    (tensor,) = sample.request.inputs
    assert tensor.name == "IN" and tensor.datatype.name == "FP32"
    assert tensor.shape == (1, 2, 4)
    np.testing.assert_array_equal(tensor.data, np.zeros((1, 2, 4), np.float32))
    assert tensor.data.dtype == np.float32


def test_without_batching_the_shape_is_the_dims(tmp_path: Path) -> None:
    (sample,) = _samples(tmp_path, """model_warmup { name: "w" batch_size: 1
        inputs { key: "IN" value: { data_type: TYPE_INT32 dims: [ 5 ] zero_data: true } } }""",
        max_batch_size=0)
    data = _only_input(sample)
    assert data.shape == (5,) and data.dtype == np.int32 and not data.any()


def test_count_zero_runs_once_and_batch_size_zero_is_skipped(tmp_path: Path) -> None:
    samples = _samples(tmp_path, """
        model_warmup { name: "skipped" batch_size: 0
          inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } }
        model_warmup { name: "once" batch_size: 2
          inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } }""")
    assert [(s.name, s.batch_size, s.count) for s in samples] == [("once", 2, 1)]


def test_random_data_is_random_and_of_the_datatype(tmp_path: Path) -> None:
    warmup = """model_warmup { name: "w" batch_size: 1
        inputs { key: "A" value: { data_type: TYPE_UINT8 dims: [ 256 ] random_data: true } }
        inputs { key: "B" value: { data_type: TYPE_BOOL dims: [ 64 ] random_data: true } }
        inputs { key: "C" value: { data_type: TYPE_INT64 dims: [ 3 ] random_data: true } } }"""
    (sample,) = _samples(tmp_path, warmup, seed=1)
    a, b, c = (tensor.data for tensor in sample.request.inputs)  # inputs in name order
    assert a.dtype == np.uint8 and a.shape == (1, 256) and len(np.unique(a)) > 100
    assert b.dtype == np.bool_ and b.any() and not b.all()
    assert set(b.view(np.uint8).ravel().tolist()) == {0, 1}  # real booleans
    assert c.dtype == np.int64 and c.shape == (1, 3) and c.any()
    (other,) = _samples(tmp_path, warmup, seed=2)
    assert not np.array_equal(other.request.inputs[0].data, a)


def test_strings_are_empty_for_zero_and_random_data(tmp_path: Path) -> None:
    for kind in ("zero_data", "random_data"):
        (sample,) = _samples(tmp_path, f"""model_warmup {{ name: "w" batch_size: 1
            inputs {{ key: "S" value: {{ data_type: TYPE_STRING dims: [ 3 ] {kind}: true }} }} }}""")
        (tensor,) = sample.request.inputs
        assert tensor.datatype.name == "BYTES"
        assert tensor.data.dtype == object and tensor.data.shape == (1, 3)
        assert tensor.data.ravel().tolist() == [b"", b"", b""]


def test_input_data_file_is_read_from_the_warmup_folder(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    values = np.arange(6, dtype=np.float32)
    (tmp_path / "warmup" / "in.bin").write_bytes(values.tobytes() + b"extra bytes are unused")
    (sample,) = _samples(tmp_path, """model_warmup { name: "w" batch_size: 1
        inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 2, 3 ]
                                     input_data_file: "in.bin" } } }""")
    np.testing.assert_array_equal(_only_input(sample), values.reshape(1, 2, 3))


def test_string_file_holds_length_prefixed_elements(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    words = [b"hello", b"", b"warm up"]
    raw = b"".join(struct.pack("<I", len(w)) + w for w in words)
    (tmp_path / "warmup" / "words").write_bytes(raw)
    (sample,) = _samples(tmp_path, """model_warmup { name: "w" batch_size: 1
        inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 3 ]
                                    input_data_file: "words" } } }""", max_batch_size=0)
    assert _only_input(sample).tolist() == words
    with pytest.raises(ModelLoadError) as caught:
        _samples(tmp_path, """model_warmup { name: "w" batch_size: 1
            inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 4 ]
                                        input_data_file: "words" } } }""", max_batch_size=0)
    assert caught.value.message == (
        "Invalid argument: warmup setting expects 4 string elements, but the data provided "
        "from words only has 3 complete ones"
    )


def test_missing_file_fails_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as caught:
        _samples(tmp_path, """model_warmup { name: "w" batch_size: 1
            inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 2 ]
                                         input_data_file: "absent.bin" } } }""")
    assert caught.value.message == (
        "Invalid argument: warmup setting of input 'IN' names input_data_file "
        "'warmup/absent.bin', which does not exist in model 'm'"
    )
    assert str(tmp_path) not in caught.value.message


def test_file_outside_the_warmup_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match="resolves outside the model's warmup folder"):
        _samples(tmp_path, """model_warmup { name: "w" batch_size: 1
            inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 2 ]
                                         input_data_file: "../secret" } } }""")


def test_short_file_fails_with_tritons_message(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ModelLoadError) as caught:
        _samples(tmp_path, """model_warmup { name: "w" batch_size: 1
            inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ]
                                         input_data_file: "short.bin" } } }""")
    assert caught.value.message == (
        "Invalid argument: warmup setting expects 16 bytes, but the data provided from "
        "short.binonly has 10 bytes"
    )


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "data_type: TYPE_FP32 dims: [ -1 ] zero_data: true",
            "warmup setting expects all variable-size dimensions are specified for input 'IN'",
        ),
        (
            "data_type: TYPE_FP32 dims: [ 2 ]",
            "warmup setting expects input 'IN' to have input_data_type set",
        ),
    ],
)
def test_bad_settings_fail_with_tritons_messages(
    tmp_path: Path, value: str, message: str
) -> None:
    with pytest.raises(ModelLoadError) as caught:
        _samples(tmp_path, f"""model_warmup {{ name: "w" batch_size: 1
            inputs {{ key: "IN" value: {{ {value} }} }} }}""")
    assert caught.value.message == "Invalid argument: " + message
