"""Protobuf messages as the JSON Triton prints.

Triton prints protobuf JSON with field names kept and every field without presence printed,
but turns 64-bit integers back into JSON numbers, where protobuf's JSON mapping writes them
as strings. The NVIDIA clients read those numbers with rapidjson ``GetUint64``/``GetInt64``,
which assert on a string, so the conversion matters (triton-facts §0 items 6 and 10).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any, cast

from google.protobuf import descriptor, json_format
from google.protobuf.message import Message

_INT64_TYPES = frozenset(
    {
        descriptor.FieldDescriptor.TYPE_INT64,
        descriptor.FieldDescriptor.TYPE_UINT64,
        descriptor.FieldDescriptor.TYPE_SINT64,
        descriptor.FieldDescriptor.TYPE_FIXED64,
        descriptor.FieldDescriptor.TYPE_SFIXED64,
    }
)
# Well-known types have their own JSON forms (Int64Value is a bare string, Struct is free
# JSON); they are left exactly as protobuf prints them.
_WELL_KNOWN_PREFIX = "google.protobuf."
# int64 fields Triton leaves as JSON strings in a model config (model_config_utils.cc
# ModelConfigToJson).
_CONFIG_INT64_AS_STRING = frozenset(
    {
        ("inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape", "dim"),
        ("inference.ModelInstanceGroup.SecondaryDevice", "device_id"),
    }
)


def message_to_json(
    message: Message, int64_as_string: AbstractSet[tuple[str, str]] = frozenset()
) -> dict[str, Any]:
    """``message`` as a JSON-ready dict, Triton style: every field, 64-bit ints as numbers.

    ``int64_as_string`` names ``(message full name, field name)`` pairs left as protobuf's
    strings, for the few fields Triton itself leaves that way. For a map field the pair is
    the message holding the map and the map field's name.
    """
    data: dict[str, Any] = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _int64_to_numbers(cast(descriptor.Descriptor, message.DESCRIPTOR), data, int64_as_string)
    return data


def config_to_json(config: Message) -> dict[str, Any]:
    """A ``ModelConfig`` as Triton prints it (its config endpoint, a python model's
    ``args["model_config"]``): every field, int64s as numbers but the two Triton leaves as
    strings."""
    return message_to_json(config, _CONFIG_INT64_AS_STRING)


def _int64_to_numbers(
    desc: descriptor.Descriptor, data: dict[str, Any], keep: AbstractSet[tuple[str, str]]
) -> None:
    """Rewrite, in place, the 64-bit integer strings of ``data`` (printed from ``desc``)."""
    for field in desc.fields:
        if field.name not in data:
            continue  # an unset oneof member or sub-message
        value = data[field.name]
        as_string = (desc.full_name, field.name) in keep
        message_type = field.message_type
        if message_type is not None:
            if message_type.GetOptions().map_entry:
                value_field = message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    if not value_field.message_type.full_name.startswith(_WELL_KNOWN_PREFIX):
                        for item in value.values():
                            _int64_to_numbers(value_field.message_type, item, keep)
                elif value_field.type in _INT64_TYPES and not as_string:
                    for key in value:
                        value[key] = int(value[key])
            elif message_type.full_name.startswith(_WELL_KNOWN_PREFIX):
                continue
            elif field.is_repeated:
                for item in value:
                    _int64_to_numbers(message_type, item, keep)
            else:
                _int64_to_numbers(message_type, value, keep)
        elif field.type in _INT64_TYPES and not as_string:
            if field.is_repeated:
                data[field.name] = [int(item) for item in value]
            else:
                data[field.name] = int(value)
