"""``ModelConfig`` for ``auto_complete_config``, and the helpers that read a config dict.

A config dict is the model configuration in the JSON form the config endpoint prints
(``json.loads(args["model_config"])``). ``auto_complete_config`` may only add to what
``config.pbtxt`` says: set a batch size no smaller than the configured one, add dynamic
batching when no other scheduler is set, add inputs and outputs or fill in the type and dims
of ones the file names, set the transaction policy. Anything that contradicts the file raises
``ValueError`` (which fails the load, with the message), as in Triton.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    """The configuration being completed; ``as_dict()`` is the live dict."""

    def __init__(self, model_config: str | Mapping[str, Any]) -> None:
        """From the config's JSON text (or a dict of it, copied)."""
        text = model_config if isinstance(model_config, str) else json.dumps(model_config)
        self._model_config: dict[str, Any] = json.loads(text)

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._model_config.get("max_batch_size", 0) or 0)
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._model_config.get(other) is not None:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: Mapping[str, Any], keys: tuple[str, ...]) -> None:
        """Add input/output ``tensor``, or complete the configured one of its name."""
        name = tensor.get("name")
        allowed = ", ".join(f"'{key}'" for key in keys)
        if any(key not in keys for key in tensor):
            raise ValueError(
                f"{kind} '{name}' in auto-complete-config function for model '{self._name}' "
                f"contains property other than {allowed}."
            )
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                label = f"{kind} '{name}'" if required != "name" else kind
                raise ValueError(
                    f"{label} in auto-complete-config function for model '{self._name}' is "
                    f"missing '{required}' property."
                )
        tensors: list[dict[str, Any]] = self._model_config.setdefault(kind, [])
        current = next((t for t in tensors if t.get("name") == name), None)
        if current is None:
            tensors.append(dict(tensor))
            return
        configured_type = current.get("data_type", "TYPE_INVALID")
        if configured_type not in ("TYPE_INVALID", tensor["data_type"]):
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype "
                f"{configured_type} for {kind} '{name}', model provides {tensor['data_type']}"
            )
        configured_dims = [int(d) for d in current.get("dims") or []]
        if configured_dims and configured_dims != [int(d) for d in tensor["dims"]]:
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects dims "
                f"{list(tensor['dims'])} but the model configuration specifies dims "
                f"{configured_dims}"
            )
        if "optional" in tensor and "optional" in current and (
            bool(current["optional"]) != bool(tensor["optional"])
        ):
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects optional "
                f"{tensor['optional']} but the model configuration specifies optional "
                f"{current['optional']}"
            )
        current.update(tensor)


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    """The config dict's input ``name`` (a dict), or None."""
    return _by_name(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    """The config dict's output ``name`` (a dict), or None."""
    return _by_name(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether the config dict sets ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


def _by_name(model_config: Mapping[str, Any], kind: str, name: str) -> Any:
    return next((t for t in model_config.get(kind) or () if t.get("name") == name), None)
