"""Model repositories built for tests from ``scripts/make_models.py``."""

from __future__ import annotations

from pathlib import Path

from scripts import make_models

#: Every V2 datatype; a ``dt_<type>`` identity model exists for each.
DATATYPES = make_models.V2_DATATYPES


def identity_name(datatype: str) -> str:
    return f"dt_{datatype.lower()}"


def build_datatype_repository(root: Path) -> Path:
    """``dt_<type>`` identities ([batch, -1], auto-completed) for every datatype, ``add_sub_fp32``,
    a non-batching identity with a config, and a raw-request model with two variable dims."""
    for datatype in DATATYPES:
        make_models.save(
            make_models.identity(datatype, ["batch", -1]),
            root / identity_name(datatype) / "1" / "model.onnx",
        )
    make_models.save(make_models.add_sub("FP32"), root / "add_sub_fp32" / "1" / "model.onnx")
    make_models.save(make_models.identity("FP32", [8]), root / "nobatch_fp32" / "1" / "model.onnx")
    (root / "nobatch_fp32" / "config.pbtxt").write_text(
        'name: "nobatch_fp32"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
    )
    make_models.save(
        make_models.identity("FP16", ["batch", -1, -1]), root / "two_var_fp16" / "1" / "model.onnx"
    )
    make_models.save(
        make_models.identity("BYTES", ["batch", 1]), root / "bytes_one" / "1" / "model.onnx"
    )
    return root
