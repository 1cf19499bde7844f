"""Flags from the environment: ``TENSORGATE_<FLAG>`` sets ``--<flag>`` (``TENSORGATE_HTTP_PORT=9000``
is ``--http-port=9000``), for platforms where the environment is easier to set than the command.

The command line wins: a flag given there ignores its variable (for a repeatable flag too: the
values do not add up). A repeatable flag takes several values from one variable separated by
``;``, which no value form uses (``--backend-config`` values hold commas, cloud paths and
``--cuda-memory-pool-byte-size`` colons). An empty variable is not set. A flag without a value
(``--disable-auto-complete-config``) takes a boolean: true gives the flag, false leaves it out.

Every child process of the supervisor reads the same variables and command line, so each gets
the same settings.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

PREFIX = "TENSORGATE_"
SEPARATOR = ";"
_NOT_SETTABLE = ("--help", "--version")

EPILOG = (
    f"Each flag can also be set by an environment variable: {PREFIX} and the flag's name in "
    f"capitals with underscores for dashes ({PREFIX}HTTP_PORT=9000 for --http-port=9000, "
    f"{PREFIX}MODEL_REPOSITORY=/models). A flag on the command line wins over its variable. "
    f"A repeatable flag takes several values from one variable separated by '{SEPARATOR}' "
    f"({PREFIX}MODEL_REPOSITORY='/a{SEPARATOR}/b'); a flag without a value takes true or false "
    f"({PREFIX}DISABLE_AUTO_COMPLETE_CONFIG=true); an empty variable counts as not set."
)


def variable(option: str) -> str:
    """The environment variable of ``--option``."""
    return PREFIX + option.removeprefix("--").upper().replace("-", "_")


class EnvironmentFlagError(ValueError):
    """A variable that cannot be a flag (two names of one flag set, a bad boolean)."""


def flags_from_environment(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str],
    parse_bool: Callable[[str], bool],
) -> tuple[list[str], dict[str, str]]:
    """Command-line words for the variables set in ``environ`` whose flag ``argv`` lacks, and
    for each such flag the variable it came from."""
    words: list[str] = []
    origins: dict[str, str] = {}
    for action in parser._actions:
        options = [o for o in action.option_strings if o.startswith("--")]
        if not options or options[0] in _NOT_SETTABLE or _given(options, argv):
            continue
        found = [(o, environ[variable(o)]) for o in options if environ.get(variable(o))]
        if not found:
            continue
        if len(found) > 1:
            names = " and ".join(variable(o) for o, _ in found)
            raise EnvironmentFlagError(f"{names} set the same flag: set one of them")
        option, text = found[0]
        origins[option] = variable(option)
        if action.nargs == 0:  # a flag without a value
            try:
                enabled = parse_bool(text)
            except argparse.ArgumentTypeError as exc:
                raise EnvironmentFlagError(f"{variable(option)}: {exc}") from None
            words += [option] if enabled else []
        elif isinstance(action, argparse._AppendAction):
            words += [f"{option}={v.strip()}" for v in text.split(SEPARATOR) if v.strip()]
        else:
            words.append(f"{option}={text}")
    return words, origins


def _given(options: Sequence[str], argv: Sequence[str]) -> bool:
    """Whether ``argv`` has one of ``options`` (``--flag``, ``--flag value``, ``--flag=value``:
    with abbreviations off, argparse knows an option by exactly these forms)."""
    return any(word == o or word.startswith(o + "=") for word in argv for o in options)

