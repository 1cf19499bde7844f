"""Model configuration: parse ``config.pbtxt`` (or the one ``--model-config-name`` picks),
fill Triton's defaults, check it, print it.

The config is Triton's ``inference.ModelConfig`` protobuf, parsed with protobuf's text format,
so a field we do not know is an error rather than silently ignored. ``to_json`` prints it the
way Triton's model configuration extension does (triton-facts §3.5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol import sequence_spec
from server.protocol.proto_json import config_to_json
from server.repository.paths import regular_file
from server.scheduling.layout import validate_config as validate_batch_layout

ModelConfig = mc.ModelConfig
CONFIG_FILE = "config.pbtxt"
CUSTOM_CONFIG_FOLDER = "configs"  # <model>/configs/<name>.pbtxt, chosen by --model-config-name


def config_file(model_dir: Path, config_name: str | None = None) -> str:
    """The model's config file, relative to its folder: ``configs/<config_name>.pbtxt`` when
    ``--model-config-name`` is set and the model has that file, else ``config.pbtxt`` (as
    Triton picks it; a model without the custom file falls back to the default one)."""
    if config_name:
        custom = f"{CUSTOM_CONFIG_FOLDER}/{config_name}.pbtxt"
        if regular_file(model_dir / custom, "the config", model_dir.name, custom) is not None:
            return custom
    return CONFIG_FILE


def read_config(model_dir: Path, config_name: str | None = None) -> ModelConfig:
    """Parse the model's config file (``config_file``); an empty config when it is absent."""
    config = ModelConfig()
    name = config_file(model_dir, config_name)
    path = regular_file(model_dir / name, "the config", model_dir.name, name)
    if path is None:
        return config
    try:
        text_format.Parse(path.read_text(encoding="utf-8"), config)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"failed to parse {name} of model '{model_dir.name}': {exc}")
    except OSError as exc:
        raise ModelLoadError(
            f"failed to read {name} of model '{model_dir.name}': {exc.strerror}"
        ) from None
    return config


def parse_json_config(text: str) -> ModelConfig:
    """Parse a config given as JSON (the form ``to_json`` prints)."""
    config = ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise ModelLoadError(f"failed to parse JSON model config: {exc}")
    return config


def to_json(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton's config endpoint prints it: every primitive, int64s as numbers
    (except the two fields Triton leaves as strings)."""
    return config_to_json(config)


def normalize(config: ModelConfig, gpu_count: int, visible_gpus: int | None = None) -> None:
    """Fill the defaults Triton's core fills (model_config_utils.cc NormalizeModelConfig).

    ``gpu_count`` is how many GPUs the model's backend can drive (KIND_AUTO becomes KIND_GPU
    when there are any); an explicit KIND_GPU group without ``gpus`` gets every visible GPU
    (``visible_gpus``, by default the same number)."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if not sequence.max_sequence_idle_microseconds:
            sequence.max_sequence_idle_microseconds = sequence_spec.DEFAULT_IDLE_US
        oldest = sequence.oldest
        if (
            sequence.HasField("oldest")
            and not oldest.preferred_batch_size
            and config.max_batch_size > 0
        ):
            oldest.preferred_batch_size.append(config.max_batch_size)
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    visible = gpu_count if visible_gpus is None else visible_gpus
    _normalize_instance_groups(config, gpu_count, visible)


def _normalize_instance_groups(config: ModelConfig, gpu_count: int, visible_gpus: int) -> None:
    kind = mc.ModelInstanceGroup.Kind
    if not config.instance_group:
        group = config.instance_group.add()
        group.name = config.name
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == kind.KIND_AUTO:
            group.kind = kind.KIND_GPU if gpu_count > 0 else kind.KIND_CPU
        if group.kind == kind.KIND_GPU and not group.gpus:
            group.gpus.extend(range(max(gpu_count, visible_gpus)))
        if group.count < 1:
            # Triton's SetDefaultInstanceCount: 2 CPU instances for ONNX Runtime, else 1.
            group.count = 2 if group.kind == kind.KIND_CPU else 1


def _unimplemented(config: ModelConfig) -> list[str]:
    """The config features this server does not implement yet, as the config spells them.
    Each would change how the model is served, so a config asking for one is refused rather
    than served as if it were not there."""
    return [
        field
        for field, asked in (
            ("model_repository_agents", bool(config.model_repository_agents.agents)),
            ("model_operations", bool(config.model_operations.op_library_filename)),
            ("cc_model_filenames", bool(config.cc_model_filenames)),
            ("model_metrics", config.HasField("model_metrics")),
            ("instance_group { passive: true }", any(g.passive for g in config.instance_group)),
        )
        if asked
    ]


def validate(config: ModelConfig) -> None:
    """Refuse configs Triton refuses, with Triton's messages where it has them, and configs
    asking for what this server does not do yet."""
    name = config.name
    missing = _unimplemented(config)
    if missing:
        raise ModelLoadError(
            f"model '{name}': {', '.join(missing)} in its configuration is not supported by "
            "this server yet; remove it to serve the model without it"
        )
    if config.max_batch_size < 0:
        raise ModelLoadError("'max_batch_size' must be non-negative value")
    if config.HasField("dynamic_batching"):
        for size in config.dynamic_batching.preferred_batch_size:
            if size < 1:
                raise ModelLoadError("dynamic batching preferred size must be positive")
            if size > config.max_batch_size:
                raise ModelLoadError(
                    f"dynamic batching preferred size must be <= max batch size for {name}"
                )
        _validate_priorities(config.dynamic_batching)
    sequence_spec.validate(config)
    if not config.input:
        raise ModelLoadError(f"model '{name}' must specify at least one input")
    if not config.output:
        raise ModelLoadError(f"model '{name}' must specify at least one output")
    for kind_name, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            if not tensor.name:
                raise ModelLoadError(f"model '{name}' has an {kind_name} without a name")
            if tensor.name in seen:
                raise ModelLoadError(f"model '{name}' declares {kind_name} '{tensor.name}' twice")
            seen.add(tensor.name)
            if tensor.data_type == mc.TYPE_INVALID:
                raise ModelLoadError(
                    f"model '{name}' {kind_name} '{tensor.name}' must specify 'data_type'"
                )
            for dim in tensor.dims:
                if dim < -1:
                    raise ModelLoadError(
                        f"model '{name}' {kind_name} '{tensor.name}' has invalid dim {dim}"
                    )
    validate_batch_layout(config)
    for group in config.instance_group:
        if group.kind not in (mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_GPU):
            raise ModelLoadError(
                f"instance group {group.name} of model {name} has unsupported kind "
                f"{mc.ModelInstanceGroup.Kind.Name(group.kind)}"
            )
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            raise ModelLoadError(
                f"instance group {group.name} of model {name} has kind KIND_GPU but no GPUs "
                "are available"
            )


def _validate_priorities(batching: mc.ModelDynamicBatching) -> None:
    levels = batching.priority_levels
    if levels > 0 and not 1 <= batching.default_priority_level <= levels:
        raise ModelLoadError(f"default priority level must be in range [1, {levels}]")
    for level in batching.priority_queue_policy:
        if not 1 <= level <= levels:
            raise ModelLoadError(
                f"priority queue policy must have priority level in range [1, {levels}]"
            )
    if batching.preserve_ordering:
        if levels > 1:
            raise ModelLoadError(
                "Only one priority level is allowed when 'preserve_ordering' is true"
            )
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.timeout_action == mc.ModelQueuePolicy.DELAY for p in policies):
            raise ModelLoadError(
                "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"
            )
