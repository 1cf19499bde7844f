"""The trace settings the server starts with: ``--trace-config`` as tritonserver 2.51 reads it
(``src/command_line_parser.cc``), and its deprecated forms ``--trace-file``,
``--trace-level``, ``--trace-rate``, ``--trace-count`` and ``--trace-log-frequency``.

``--trace-config <setting>=<value>`` sets a global setting (``level``, ``rate``, ``count``,
``mode``); ``--trace-config <mode>,<setting>=<value>`` one of a mode: ``triton,file=<path>``,
``triton,log-frequency=<n>``, ``opentelemetry,url=<endpoint>``,
``opentelemetry,resource=<key>=<value>``, ``opentelemetry,bsp_max_queue_size=<n>`` (also
``bsp_schedule_delay`` in ms, ``bsp_max_export_batch_size``; defaults from ``OTEL_BSP_*``).
Levels add up across flags; ``level=OFF`` anywhere turns tracing off. A ``--trace-config``
value wins over the deprecated flag. Unlike Triton, which ignores them, an unknown setting is
refused: a launch line is never half-obeyed in silence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MODES = ("triton", "opentelemetry")
#: Levels in the order the trace setting answers list them.
LEVELS = ("TIMESTAMPS", "TENSORS")
DEFAULT_OTEL_URL = "http://localhost:4318/v1/traces"
#: The batch span processor's settings, with their variables and defaults.
_BSP = (
    ("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
    ("bsp_schedule_delay", "OTEL_BSP_SCHEDULE_DELAY", "5000"),
    ("bsp_max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
)
_UINT32_MAX = (1 << 32) - 1
_INT32_MAX = (1 << 31) - 1
_FORMAT = "--trace-config option format is '<trace mode>,<setting>=<value>'. Got "


class TraceConfigError(ValueError):
    """A ``--trace-config`` (or deprecated ``--trace-*``) value that does not parse."""


@dataclass(frozen=True)
class TraceConfig:
    """The start-up trace settings. ``level`` is empty when tracing is off; ``options`` are
    the mode's other settings in the order given, as the trace setting answers show them
    (OpenTelemetry's url, resource and batch span processor settings)."""

    level: tuple[str, ...] = ()
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    options: tuple[tuple[str, str], ...] = ()

    def option(self, key: str, default: str = "") -> str:
        """The last value given for a mode setting."""
        found = [value for name, value in self.options if name == key]
        return found[-1] if found else default

    def resources(self) -> dict[str, str]:
        """OpenTelemetry resource attributes: ``service.name`` and the ``resource=`` ones."""
        attributes = {"service.name": "triton-inference-server"}
        for name, value in self.options:
            if name == "resource":
                key, _, text = value.partition("=")
                attributes[key] = text
        return attributes


def level_of(text: str) -> str | None:
    """A trace level as the command line takes it: None for off (``off``, ``false``)."""
    word = text.lower()
    if word in ("false", "off"):
        return None
    if word in ("true", "on", "min", "max", "timestamps"):
        return "TIMESTAMPS"
    if word == "tensors":
        return "TENSORS"
    raise TraceConfigError(f"invalid value for trace level option: {word}")


def _mode(text: str) -> str:
    word = text.lower()
    if word not in MODES:
        raise TraceConfigError(
            f'invalid value for trace mode option: {word}. Available options are "triton" '
            'and "opentelemetry"'
        )
    return word


def _split(text: str) -> tuple[str, str, str]:
    """``[<mode>,]<setting>=<value>`` as (mode or "", setting, value)."""
    comma = text.find(",")
    mode = ""
    if comma > 0:
        mode = _mode(text[:comma])
    elif comma == 0:
        raise TraceConfigError(
            "No trace mode specified. --trace-config option format is "
            f"<trace mode>,<setting>=<value> or <setting>=<value>. Got {text}"
        )
    equals = text.find("=", comma + 1)
    if equals < 0:
        raise TraceConfigError(_FORMAT + text)
    setting, value = text[comma + 1:equals], text[equals + 1:]
    if not setting or not value:
        raise TraceConfigError(_FORMAT + text)
    return mode, setting, value


def _integer(value: str, flag: str, least: int, most: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TraceConfigError(f'Bad option: "{flag}": not an integer: {value}') from None
    if not least <= number <= most:
        raise TraceConfigError(f'Bad option: "{flag}": {value} is not in [{least}, {most}]')
    return number


def parse(
    configs: Sequence[str],
    deprecated: Mapping[str, Sequence[str]],
    environ: Mapping[str, str] | None = None,
) -> TraceConfig:
    """The start-up settings from the ``--trace-config`` values and the deprecated flags
    (``deprecated`` maps ``file``, ``level``, ``rate``, ``count``, ``log-frequency`` to
    their values; the last of each counts, levels add up)."""
    environ = os.environ if environ is None else environ
    levels: list[str] = []
    disabled = False
    for text in deprecated.get("level", ()):
        level = level_of(text)
        disabled |= level is None
        levels += [level] if level else []
    scalars = {
        key: values[-1] for key, values in deprecated.items() if values and key != "level"
    }
    rate = _integer(scalars.get("rate", "1000"), "--trace-rate", 0, _INT32_MAX)
    count = _integer(scalars.get("count", "-1"), "--trace-count", -1, _INT32_MAX)
    frequency = _integer(
        scalars.get("log-frequency", "0"), "--trace-log-frequency", 0, _INT32_MAX
    )
    file = scalars.get("file", "")
    mode = "triton"
    by_mode: dict[str, list[tuple[str, str]]] = {name: [] for name in MODES}
    for text in configs:
        name, setting, value = _split(text)
        if name:
            by_mode[name].append((setting, value))
            continue
        flag = f"--trace-config {setting}"
        if setting == "rate":
            rate = _integer(value, flag, 0, _INT32_MAX)
        elif setting == "count":
            count = _integer(value, flag, -1, _INT32_MAX)
        elif setting == "mode":
            mode = _mode(value)
        elif setting == "level":
            level = level_of(value)
            disabled |= level is None
            levels += [level] if level else []
        else:
            raise TraceConfigError(
                f"--trace-config {text}: unknown setting '{setting}' (global settings: "
                "level, rate, count, mode)"
            )
    options: list[tuple[str, str]] = []
    if mode == "triton":
        for setting, value in by_mode["triton"]:
            if setting == "file":
                file = value
            elif setting == "log-frequency":
                frequency = _integer(
                    value, "--trace-config triton,log-frequency", 0, _INT32_MAX
                )
            else:
                raise TraceConfigError(
                    f"--trace-config triton,{setting}={value}: unknown setting '{setting}' "
                    "(triton mode: file, log-frequency)"
                )
    else:
        options = _otel_options(by_mode["opentelemetry"], environ)
    chosen = () if disabled else tuple(level for level in LEVELS if level in levels)
    return TraceConfig(chosen, rate, count, frequency, file, mode, tuple(options))


def _otel_options(
    given: list[tuple[str, str]], environ: Mapping[str, str]
) -> list[tuple[str, str]]:
    """OpenTelemetry's settings in the order given, then the batch span processor's
    defaults (or ``OTEL_BSP_*``) for those not given; numbers checked."""
    options = []
    named = {name for name, _, _ in _BSP}
    for setting, value in given:
        if setting in named:
            number = _integer(value, f"--trace-config opentelemetry,{setting}", 0, _UINT32_MAX)
            options.append((setting, str(number)))
        elif setting in ("url", "resource"):
            options.append((setting, value))
        else:
            raise TraceConfigError(
                f"--trace-config opentelemetry,{setting}={value}: unknown setting "
                f"'{setting}' (opentelemetry mode: url, resource, bsp_max_queue_size, "
                "bsp_schedule_delay, bsp_max_export_batch_size)"
            )
    seen = {setting for setting, _ in options}
    for setting, variable, default in _BSP:
        if setting not in seen:
            value = environ.get(variable, default)
            options.append((setting, str(_integer(value, variable, 0, _UINT32_MAX))))
    return options
