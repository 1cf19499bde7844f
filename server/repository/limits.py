"""Bounds on what one model configuration may ask for, checked before anything is allocated.

A config sent with a load request is client input: ``count: 100000`` in an instance group
would start 100,000 sessions and threads, ``priority_levels: 1000000000`` would make a queue
per level, and 100,000 inputs would be walked on every metadata request. Triton sets no such
bounds; these are far above what real models use (README, "Limits and security").
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc

#: Instances of one model version, over all its instance groups and their GPUs.
MAX_INSTANCES = 256
#: ``dynamic_batching.priority_levels``: the batcher keeps two queues per level.
MAX_PRIORITY_LEVELS = 256
#: Entries of any repeated or map field: inputs, outputs, preferred batch sizes, versions,
#: parameters, instance groups, GPUs, ...
MAX_ENTRIES = 1024
#: Entries of a ``dims`` or ``shape`` field: numpy 1 arrays have at most 32 dimensions.
MAX_DIMS = 32
_DIM_FIELDS = frozenset({"dims", "shape"})


def check_limits(config: mc.ModelConfig) -> None:
    """Refuse a config past any bound, naming the field, before it is used."""
    name = config.name
    _check_entries(config, "", name)
    if config.dynamic_batching.priority_levels > MAX_PRIORITY_LEVELS:
        raise _too_many(
            name, "dynamic_batching.priority_levels", config.dynamic_batching.priority_levels,
            MAX_PRIORITY_LEVELS,
        )
    instances = 0
    for index, group in enumerate(config.instance_group):
        if group.count > MAX_INSTANCES:
            raise _too_many(name, f"instance_group[{index}].count", group.count, MAX_INSTANCES)
        instances += max(group.count, 1) * max(len(group.gpus), 1)
    if instances > MAX_INSTANCES:
        raise ModelLoadError(
            f"model '{name}' asks for {instances} instances in its instance groups (count "
            f"times GPUs), more than the {MAX_INSTANCES} allowed"
        )


def _check_entries(message: Message, path: str, model: str) -> None:
    """Every repeated field of ``message`` and of the messages inside it, iteratively."""
    pending: list[tuple[Message, str]] = [(message, path)]
    while pending:
        current, prefix = pending.pop()
        for field, value in current.ListFields():
            where = f"{prefix}{field.name}"
            is_message = field.type == FieldDescriptor.TYPE_MESSAGE
            if not field.is_repeated:
                if is_message:
                    pending.append((value, f"{where}."))
                continue
            limit = MAX_DIMS if field.name in _DIM_FIELDS else MAX_ENTRIES
            if len(value) > limit:
                raise _too_many(model, where, len(value), limit, entries=True)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                values = value.values()
                if field.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                    pending.extend((item, f"{where}[].") for item in values)
            elif is_message:
                pending.extend((item, f"{where}[{i}].") for i, item in enumerate(value))


def _too_many(
    model: str, field: str, value: int, limit: int, entries: bool = False
) -> ModelLoadError:
    what = f"has {value} entries" if entries else f"is {value}"
    return ModelLoadError(
        f"model '{model}': '{field}' {what}, more than the {limit} allowed"
    )
