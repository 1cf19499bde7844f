"""A model's ``sequence_batching`` settings, read once at load time (triton-features §2.1).

Control inputs and implicit-state inputs are model inputs that the sequence batcher supplies:
they are not in the config's ``input`` list, so clients neither see them in the model metadata
nor may send them. Each control tensor holds one element per request (shape ``[1]``, or
``[1, 1]`` with the batch dimension), as Triton's sequence batcher sets them.

``validate`` refuses what Triton's core refuses (model_config_utils.cc), with its messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from server.protocol.datatypes import DataType

Control = mc.ModelSequenceBatching.Control
#: ``max_sequence_idle_microseconds`` 0 means this (Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS).
DEFAULT_IDLE_US = 1_000_000
_BOOL_KINDS = (
    Control.CONTROL_SEQUENCE_START,
    Control.CONTROL_SEQUENCE_END,
    Control.CONTROL_SEQUENCE_READY,
)
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)

SequenceId = int | str


@dataclass(frozen=True)
class FlagControl:
    """A START, END or READY control: the input it fills and its false and true values."""

    name: str
    datatype: DataType
    false_true: tuple[object, object]

    def tensor(self, flag: bool, batching: bool) -> np.ndarray:
        value = self.false_true[1] if flag else self.false_true[0]
        return np.full((1, 1) if batching else (1,), value, dtype=self.datatype.dtype)


@dataclass(frozen=True)
class CorrIdControl:
    """The CORRID control: the sequence's id as one element of ``datatype``."""

    name: str
    datatype: DataType

    def tensor(self, sequence_id: SequenceId, batching: bool) -> np.ndarray:
        shape = (1, 1) if batching else (1,)
        if self.datatype.is_bytes:
            text = sequence_id if isinstance(sequence_id, str) else str(sequence_id)
            return np.full(shape, text.encode(), dtype=object)
        # A string id reaches a numeric CORRID only if it reads as a number that fits;
        # checked by ``corrid_error`` when the request arrives.
        number = int(sequence_id) if isinstance(sequence_id, str) else sequence_id
        return np.full(shape, number, dtype=self.datatype.dtype)

    def error(self, sequence_id: SequenceId) -> str | None:
        """Why this id cannot be given to the model as its CORRID (None: it can)."""
        if self.datatype.is_bytes:
            return None
        try:
            number = int(sequence_id)
        except ValueError:
            return (
                f"correlation ID '{sequence_id}' is not a number, but the model's "
                f"{self.name} control is {self.datatype.config_name}"
            )
        info = np.iinfo(self.datatype.dtype)
        if not info.min <= number <= info.max:
            return (
                f"correlation ID {sequence_id} does not fit the model's {self.name} control "
                f"({self.datatype.config_name})"
            )
        return None


@dataclass(frozen=True)
class StateSpec:
    """One implicit state: fed to ``input_name`` from the previous ``output_name`` of the same
    sequence; ``dims`` exclude the batch dimension."""

    input_name: str
    output_name: str
    datatype: DataType
    dims: tuple[int, ...]
    #: the ``initial_state`` read from its data file (shaped as ``dims``); None: zeros
    initial_data: np.ndarray | None = None

    def initial(self, batching: bool) -> np.ndarray:
        """The state at START: its initial data, else zeros (empty strings for STRING)."""
        shape = (1, *self.dims) if batching else self.dims
        if self.initial_data is not None:
            return self.initial_data.reshape(shape).copy()
        if self.datatype.is_bytes:
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=self.datatype.dtype)


@dataclass(frozen=True)
class SequenceSpec:
    """What the sequence batcher works by."""

    model: str
    batching: bool  # max_batch_size > 0
    max_batch_size: int
    idle_us: int
    oldest: bool  # the Oldest strategy (else Direct)
    max_queue_delay_us: int
    minimum_slot_utilization: float  # Direct
    max_candidate_sequences: int  # Oldest
    preferred_sizes: tuple[int, ...]  # Oldest
    start: FlagControl | None = None
    end: FlagControl | None = None
    ready: FlagControl | None = None
    corrid: CorrIdControl | None = None
    states: tuple[StateSpec, ...] = ()

    @classmethod
    def from_config(
        cls, config: mc.ModelConfig, initial_data: Mapping[str, np.ndarray] | None = None
    ) -> SequenceSpec:
        """The settings of a validated config that has ``sequence_batching``;
        ``initial_data``: the states' initial values read from their data files (by state
        input name)."""
        initial_data = initial_data or {}
        batcher = config.sequence_batching
        flags: dict[int, FlagControl] = {}
        corrid = None
        for entry in batcher.control_input:
            for control in entry.control:
                if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                    corrid = CorrIdControl(
                        entry.name, datatypes.from_config_enum(control.data_type)
                    )
                else:
                    flags[control.kind] = _flag_control(entry.name, control)
        oldest = batcher.WhichOneof("strategy_choice") == "oldest"
        return cls(
            model=config.name,
            batching=config.max_batch_size > 0,
            max_batch_size=max(1, config.max_batch_size),
            idle_us=batcher.max_sequence_idle_microseconds or DEFAULT_IDLE_US,
            oldest=oldest,
            max_queue_delay_us=(
                batcher.oldest.max_queue_delay_microseconds
                if oldest
                else batcher.direct.max_queue_delay_microseconds
            ),
            minimum_slot_utilization=batcher.direct.minimum_slot_utilization,
            max_candidate_sequences=max(1, batcher.oldest.max_candidate_sequences),
            preferred_sizes=tuple(sorted(set(batcher.oldest.preferred_batch_size))),
            start=flags.get(Control.CONTROL_SEQUENCE_START),
            end=flags.get(Control.CONTROL_SEQUENCE_END),
            ready=flags.get(Control.CONTROL_SEQUENCE_READY),
            corrid=corrid,
            states=tuple(
                StateSpec(
                    state.input_name,
                    state.output_name,
                    datatypes.from_config_enum(state.data_type),
                    tuple(state.dims),
                    initial_data.get(state.input_name),
                )
                for state in batcher.state
            ),
        )

    @property
    def state_outputs(self) -> tuple[str, ...]:
        return tuple(state.output_name for state in self.states)


def _flag_control(name: str, control: mc.ModelSequenceBatching.Control) -> FlagControl:
    if control.int32_false_true:
        return FlagControl(name, datatypes.BY_NAME["INT32"], tuple(control.int32_false_true))  # type: ignore[arg-type]
    if control.fp32_false_true:
        return FlagControl(name, datatypes.BY_NAME["FP32"], tuple(control.fp32_false_true))  # type: ignore[arg-type]
    return FlagControl(name, datatypes.BY_NAME["BOOL"], tuple(control.bool_false_true))  # type: ignore[arg-type]


def supplied_inputs(config: mc.ModelConfig) -> dict[str, DataType]:
    """The model inputs the sequence batcher fills (controls and implicit states), by name,
    with the datatype each must have; empty for a model without ``sequence_batching``. Read
    before the config is validated (auto-complete): a tensor without a known datatype is
    left out, and ``validate`` refuses it."""
    if not config.HasField("sequence_batching"):
        return {}
    batcher = config.sequence_batching
    found: dict[str, DataType] = {}
    for entry in batcher.control_input:
        for control in entry.control:
            if control.kind != Control.CONTROL_SEQUENCE_CORRID:
                found[entry.name] = _flag_control(entry.name, control).datatype
            elif control.data_type in _CORRID_TYPES:
                found[entry.name] = datatypes.from_config_enum(control.data_type)
    for state in batcher.state:
        if state.data_type != mc.TYPE_INVALID:
            found[state.input_name] = datatypes.from_config_enum(state.data_type)
    return found


def supplied_outputs(config: mc.ModelConfig) -> dict[str, DataType]:
    """The model outputs the sequence batcher keeps as implicit state, by name."""
    if not config.HasField("sequence_batching"):
        return {}
    return {
        state.output_name: datatypes.from_config_enum(state.data_type)
        for state in config.sequence_batching.state
        if state.data_type != mc.TYPE_INVALID
    }


def validate(config: mc.ModelConfig) -> None:
    """Refuse a ``sequence_batching`` section Triton refuses (its texts), and what this
    server cannot honour."""
    if not config.HasField("sequence_batching"):
        return
    name = config.name
    batcher = config.sequence_batching
    if config.response_cache.enable:
        raise ModelLoadError(
            f"Response Cache does not currently support model {name} with sequence batching "
            "scheduler. Please disable the response cache."
        )
    seen_tensors: set[str] = set()
    seen_kinds: set[int] = set()
    for entry in batcher.control_input:
        if not entry.name:
            raise ModelLoadError(f"sequence batching control tensor must have a name for {name}")
        if entry.name in seen_tensors:
            raise ModelLoadError(
                f"sequence batching control tensor '{entry.name}' is specified for multiple "
                f"control kinds for {name}"
            )
        seen_tensors.add(entry.name)
        if len(entry.control) != 1:
            raise ModelLoadError(
                f"sequence batching control tensor '{entry.name}' must have exactly one "
                f"control for {name}"
            )
        for control in entry.control:
            kind = Control.Kind.Name(control.kind)
            if control.kind in seen_kinds:
                raise ModelLoadError(
                    f"sequence batching specifies multiple {kind} tensors for {name}"
                )
            seen_kinds.add(control.kind)
            _validate_control(control, kind, name)
    names = {t.name for t in config.input}
    for tensor in seen_tensors:
        if tensor in names:
            raise ModelLoadError(
                f"sequence batching control tensor '{tensor}' of model '{name}' is also "
                "declared as an input: the scheduler fills it, clients do not send it"
            )
    _validate_states(config)
    if batcher.HasField("oldest"):
        for size in batcher.oldest.preferred_batch_size:
            if size <= 0:
                raise ModelLoadError(
                    f"sequence batching preferred batch size must be positive for {name}"
                )
            if size > config.max_batch_size:
                raise ModelLoadError(
                    "sequence batching preferred batch size must be <= max batch size for "
                    f"{name}"
                )
    utilization = batcher.direct.minimum_slot_utilization
    if batcher.HasField("direct") and not 0.0 <= utilization <= 1.0:
        raise ModelLoadError(
            f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
        )
    if batcher.iterative_sequence:
        raise ModelLoadError(
            f"model '{name}': sequence_batching {{ iterative_sequence: true }} is not "
            "supported by this server yet"
        )


def _validate_control(control: mc.ModelSequenceBatching.Control, kind: str, name: str) -> None:
    lists = {
        "int32_false_true": len(control.int32_false_true),
        "fp32_false_true": len(control.fp32_false_true),
        "bool_false_true": len(control.bool_false_true),
    }
    given = [key for key, size in lists.items() if size]
    if control.kind == Control.CONTROL_SEQUENCE_CORRID:
        if given:
            raise ModelLoadError(
                "sequence batching must not specify either 'int32_false_true', "
                f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}"
            )
        if control.data_type not in _CORRID_TYPES:
            raise ModelLoadError(
                f"unexpected data type for control {kind} for {name}. Allowed data types are "
                "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
            )
        return
    if control.kind not in _BOOL_KINDS:
        raise ModelLoadError(f"unknown sequence batching control kind {kind} for {name}")
    if not given:
        raise ModelLoadError(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind} for {name}"
        )
    if len(given) > 1:
        raise ModelLoadError(
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}"
        )
    if lists[given[0]] != 2:
        raise ModelLoadError(
            f"sequence batching control '{given[0]}' must have exactly 2 entries for {kind} "
            f"for {name}"
        )


def _validate_states(config: mc.ModelConfig) -> None:
    name = config.name
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    controls = {entry.name for entry in config.sequence_batching.control_input}
    for state in config.sequence_batching.state:
        what = f"state '{state.input_name}' of model '{name}'"
        if not state.input_name or not state.output_name:
            raise ModelLoadError(
                f"model '{name}': a sequence batching state must have an input_name and an "
                "output_name"
            )
        if state.data_type == mc.TYPE_INVALID:
            raise ModelLoadError(f"{what} must specify 'data_type'")
        if state.input_name in inputs or state.input_name in controls:
            raise ModelLoadError(
                f"{what}: its input is also declared as an input or a control input"
            )
        if state.output_name in outputs:
            raise ModelLoadError(
                f"{what}: its output '{state.output_name}' is also declared as an output"
            )
        if any(dim < 0 for dim in state.dims):
            raise ModelLoadError(
                f"{what} has variable dims {list(state.dims)}: only fixed dims are supported"
            )
        if len(state.initial_state) > 1:
            raise ModelLoadError(f"{what} has more than one initial_state")
        for initial in state.initial_state:
            if initial.data_type != state.data_type or list(initial.dims) != list(state.dims):
                raise ModelLoadError(
                    f"{what}: its initial_state must have the state's data_type and dims"
                )
            kind = initial.WhichOneof("state_data")
            if kind is None:
                raise ModelLoadError(
                    f"{what}: its initial_state must set zero_data or data_file"
                )
            if kind == "data_file" and state.data_type == mc.TYPE_STRING:
                raise ModelLoadError(
                    f"{what}: an initial_state data_file of TYPE_STRING is not supported yet"
                )
