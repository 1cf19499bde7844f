"""The classification extension against a real server, through NVIDIA's ``tritonclient``:
``InferRequestedOutput(name, class_count=k)`` over HTTP (JSON and binary) and gRPC, in both
process layouts (one process, and a front end with the executor), with a label file in the
model folder; and the refusals, 400 / INVALID_ARGUMENT (triton-features §1.3)."""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from scripts import make_models
from tests.server_process import EXAMPLES, ServerProcess, start_server

DIGITS = [f"digit_{i}" for i in range(10)]
FRUIT = ["apple", "pickle", "pear", "plum"]
CLASSES = [f"CLASS {i}" for i in range(10)]
#: densenet_onnx's config as Triton ships it, smaller: the output's dims are [10], the model's
#: tensor [10, 1, 1] (a reshape), labels in a file; max_batch_size 2 rather than 1.
SMALL_DENSENET = """name: "small_densenet"
platform: "onnxruntime_onnx"
max_batch_size : 2
input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 16, 16 ] } ]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 10 ]
    reshape { shape: [ 10, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""


def _repository(root: Path) -> Path:
    """``mlp`` (FP32 [batch, 10]) with a label file; identities for INT32, FP16 and BYTES;
    ``fruit``, a non-batching FP32 [4] identity with labels; and ``small_densenet``, an image
    classifier configured as Triton's densenet_onnx example is."""
    mlp = root / "mlp"
    shutil.copytree(EXAMPLES / "mlp", mlp)
    config = (mlp / "config.pbtxt").read_text()
    assert "dims: [ 10 ]" in config
    (mlp / "config.pbtxt").write_text(
        config.replace("dims: [ 10 ]", 'dims: [ 10 ]\n    label_filename: "digits.txt"')
    )
    (mlp / "digits.txt").write_text("\n".join(DIGITS) + "\n")
    for name, datatype in (("ints", "INT32"), ("halves", "FP16"), ("texts", "BYTES")):
        make_models.save(
            make_models.identity(datatype, ["batch", -1]), root / name / "1" / "model.onnx"
        )
    make_models.save(make_models.identity("FP32", [4]), root / "fruit" / "1" / "model.onnx")
    (root / "fruit" / "config.pbtxt").write_text(
        'name: "fruit"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }\n'
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
        'label_filename: "fruit.txt" }\n'
    )
    (root / "fruit" / "fruit.txt").write_text("\n".join(FRUIT))  # no final newline
    densenet = root / "small_densenet"
    make_models.save(
        make_models.image_classifier(image=(3, 16, 16), scores=(10, 1, 1)),
        densenet / "1" / "model.onnx",
    )
    (densenet / "config.pbtxt").write_text(SMALL_DENSENET)
    (densenet / "densenet_labels.txt").write_text("".join(f"{c}\n" for c in CLASSES))
    return root


@pytest.fixture(scope="module", params=["one process", "split"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    ServerProcess
]:
    """The same repository served in each process layout."""
    repository = _repository(tmp_path_factory.mktemp("classification_repo"))
    frontends = "--frontends=0" if request.param == "one process" else "--frontends=1"
    process = start_server(repository, args=(frontends,))
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _infer(
    transport: str,
    clients: dict[str, Any],
    model: str,
    data: np.ndarray,
    datatype: str,
    class_count: int,
    binary: bool = False,
) -> Any:
    """The result of one request for ``OUTPUT0`` with ``class_count`` over ``transport``."""
    module: Any = httpclient if transport == "http" else grpcclient
    tensor = module.InferInput("INPUT0", list(data.shape), datatype)
    if datatype == "BYTES" or transport == "grpc":
        tensor.set_data_from_numpy(data)
    else:
        tensor.set_data_from_numpy(data, binary_data=binary)
    if transport == "http":
        wanted = httpclient.InferRequestedOutput(
            "OUTPUT0", binary_data=binary, class_count=class_count
        )
    else:
        wanted = grpcclient.InferRequestedOutput("OUTPUT0", class_count=class_count)
    return clients[transport].infer(model, [tensor], outputs=[wanted])


def _texts(array: np.ndarray) -> list[str]:
    """The classes as text (tritonclient gives JSON BYTES as str, binary ones as bytes)."""
    return [item if isinstance(item, str) else item.decode() for item in array.reshape(-1)]


def _expected_top(scores: np.ndarray, k: int) -> list[str]:
    """The top ``k`` per row of ``scores``, as Triton formats them, with the digit labels."""
    out = []
    for row in scores:
        for index in sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]:
            out.append(f"{float(row[index]):f}:{index}:{DIGITS[index]}")
    return out


CASES = [("http", False), ("http", True), ("grpc", False)]


@pytest.fixture
def clients(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> dict[str, Any]:
    return {"http": http, "grpc": grpc_client}


@pytest.mark.parametrize(("transport", "binary"), CASES)
def test_the_mlp_top_three_with_labels_for_a_batch_of_two(
    clients: dict[str, Any], transport: str, binary: bool
) -> None:
    rng = np.random.default_rng(7)
    data = rng.standard_normal((2, 256)).astype(np.float32)
    raw = _infer(transport, clients, "mlp", data, "FP32", 0).as_numpy("OUTPUT0")
    assert raw.shape == (2, 10) and raw.dtype == np.float32  # class_count 0: the tensor
    result = _infer(transport, clients, "mlp", data, "FP32", 3, binary)
    top = result.as_numpy("OUTPUT0")
    assert top.shape == (2, 3)
    assert _texts(top) == _expected_top(raw, 3)
    output = result.get_output("OUTPUT0")
    datatype = output["datatype"] if transport == "http" else output.datatype
    assert datatype == "BYTES"


@pytest.mark.parametrize(("transport", "binary"), CASES)
def test_integers_ties_and_a_count_past_the_end(
    clients: dict[str, Any], transport: str, binary: bool
) -> None:
    data = np.array([[7, 7, -3, 9]], np.int32)
    top = _infer(transport, clients, "ints", data, "INT32", 9, binary).as_numpy("OUTPUT0")
    assert top.shape == (1, 4)
    assert _texts(top) == ["9:3", "7:0", "7:1", "-3:2"]


@pytest.mark.parametrize(("transport", "binary"), CASES)
def test_a_non_batching_model_gets_a_flat_result_with_its_labels(
    clients: dict[str, Any], transport: str, binary: bool
) -> None:
    data = np.array([1.1, 3.3, 0.5, 2.4], np.float32)
    top = _infer(transport, clients, "fruit", data, "FP32", 2, binary).as_numpy("OUTPUT0")
    assert top.shape == (2,)
    assert _texts(top) == ["3.300000:1:pickle", "2.400000:3:plum"]


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize(
    ("model", "datatype", "data"),
    [
        ("halves", "FP16", np.ones((1, 3), np.float16)),
        ("texts", "BYTES", np.array([[b"a", b"b"]], dtype=object)),
    ],
)
def test_an_unsupported_datatype_is_refused(
    clients: dict[str, Any], transport: str, model: str, datatype: str, data: np.ndarray
) -> None:
    with pytest.raises(InferenceServerException) as err:
        _infer(transport, clients, model, data, datatype, 2)
    assert err.value.message().endswith(
        f"class result not available for output due to unsupported type '{datatype}'"
    )
    assert err.value.status() == ("400" if transport == "http" else "StatusCode.INVALID_ARGUMENT")
    # the same output without a classification is served
    raw = _infer(transport, clients, model, data, datatype, 0).as_numpy("OUTPUT0")
    assert raw.shape == data.shape


@pytest.mark.parametrize("value", [-1, "3", 2.5, True])
def test_http_refuses_a_class_count_that_is_not_an_unsigned_integer(
    server: ServerProcess, value: Any
) -> None:
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,2],"data":[1,2]}],'
        b'"outputs":[{"name":"OUTPUT0","parameters":{"classification":'
        + json.dumps(value).encode()
        + b"}}]}"
    )
    status, _, reply = server.request("POST", "/v2/models/ints/infer", body)
    assert status == 400, reply
    assert b"attempt to access JSON non-unsigned-integer as unsigned-integer" in reply
    # the same request with a good count is served
    good = body.replace(b'"classification":' + json.dumps(value).encode(), b'"classification":1')
    status, _, reply = server.request("POST", "/v2/models/ints/infer", good)
    assert status == 200, reply
    assert json.loads(reply)["outputs"][0]["data"] == ["2:1"]


def test_grpc_refuses_a_negative_class_count(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "INT32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.int32))
    wanted = grpcclient.InferRequestedOutput("OUTPUT0", class_count=-1)
    with pytest.raises(InferenceServerException) as err:
        grpc_client.infer("ints", [tensor], outputs=[wanted])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "attempt to access JSON non-unsigned-integer as unsigned-integer" in (
        err.value.message()
    )
    # the same request with a good count is served
    good = grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)
    top = grpc_client.infer("ints", [tensor], outputs=[good]).as_numpy("OUTPUT0")
    assert _texts(top) == ["2:1"]


def test_classification_is_listed_first_in_the_extensions(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    assert http.get_server_metadata()["extensions"][0] == "classification"
    assert grpc_client.get_server_metadata().extensions[0] == "classification"


def _images(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).uniform(-1, 1, (rows, 3, 16, 16)).astype(np.float32)


def test_what_an_image_client_reads_of_a_densenet_style_model(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """NVIDIA's image client checks the metadata and config: one FP32 output of the config's
    dims (not the reshape) and the input's format, a name over HTTP and an enum over gRPC."""
    metadata = http.get_model_metadata("small_densenet")
    assert metadata["outputs"] == [{"name": "fc6_1", "datatype": "FP32", "shape": [-1, 10]}]
    assert metadata["inputs"][0]["shape"] == [-1, 3, 16, 16]
    assert http.get_model_config("small_densenet")["input"][0]["format"] == "FORMAT_NCHW"
    config = grpc_client.get_model_config("small_densenet").config
    assert config.input[0].format == model_config_pb2.ModelInput.FORMAT_NCHW
    assert list(grpc_client.get_model_metadata("small_densenet").outputs[0].shape) == [-1, 10]


def _densenet_request(module: Any, images: np.ndarray, count: int) -> dict[str, list[Any]]:
    """The keyword arguments of an ``infer`` of ``images`` asking for their top ``count``."""
    tensor = module.InferInput("data_0", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    return {
        "inputs": [tensor],
        "outputs": [module.InferRequestedOutput("fc6_1", class_count=count)],
    }


def _expected_classes(raw: np.ndarray, k: int) -> list[str]:
    return [
        f"{float(row[i]):f}:{i}:{CLASSES[i]}"
        for row in raw
        for i in sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    ]


def test_a_reshaped_output_is_classified_through_every_way_an_image_client_asks(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """A batch of two images, top three each, labelled: HTTP and gRPC, sync, async and over a
    stream, as NVIDIA's image client asks; the unclassified output has the config's dims."""
    images = _images(2)
    raw = http.infer("small_densenet", **_densenet_request(httpclient, images, 0)).as_numpy(
        "fc6_1"
    )
    assert raw.shape == (2, 10)
    expected = _expected_classes(raw, 3)
    results = [
        http.infer("small_densenet", **_densenet_request(httpclient, images, 3), request_id="1"),
        http.async_infer(
            "small_densenet", **_densenet_request(httpclient, images, 3), request_id="2"
        ).get_result(),
        grpc_client.infer("small_densenet", **_densenet_request(grpcclient, images, 3)),
    ]
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(lambda result, error: replies.put((result, error)))
    try:
        grpc_client.async_stream_infer(
            "small_densenet", **_densenet_request(grpcclient, images, 3), request_id="3"
        )
        result, error = replies.get(timeout=30)
    finally:
        grpc_client.stop_stream()
    assert error is None
    results.append(result)
    for result in results:
        top = result.as_numpy("fc6_1")
        assert top.shape == (2, 3)
        assert _texts(top) == expected


def test_a_batch_past_max_batch_size_is_refused_naming_the_request(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """Three images to a model of max_batch_size 2: refused with Triton's text, which names
    the request id the client gave (as image_client's ``-b 2`` to densenet_onnx is refused)."""
    text = "[request id: 1] inference request batch-size must be <= 2 for 'small_densenet'"
    with pytest.raises(InferenceServerException) as err:
        http.infer("small_densenet", **_densenet_request(httpclient, _images(3), 3), request_id="1")
    assert (err.value.status(), err.value.message()) == ("400", text)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(lambda result, error: replies.put((result, error)))
    try:
        grpc_client.async_stream_infer(
            "small_densenet", **_densenet_request(grpcclient, _images(3), 3), request_id="1"
        )
        _, error = replies.get(timeout=30)
    finally:
        grpc_client.stop_stream()
    assert error is not None and error.message() == text
