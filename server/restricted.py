"""Restricted APIs: ``--http-restricted-api`` and ``--grpc-restricted-protocol``.

Each flag names API categories and one header a request of those categories must carry with
one value; without it the request is refused (HTTP 403, gRPC UNAVAILABLE) before anything
else is looked at. Parsed here with tritonserver's texts, checked here for both transports;
which route or method is in which category is the transports' own table
(``server.http.categories``, ``server.grpc.restriction``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from server.errors import Restricted

#: Triton's category names (``src/restricted_features.h``), in its order.
CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
HEALTH, METADATA, INFERENCE, SHARED_MEMORY, MODEL_CONFIG = CATEGORIES[:5]
MODEL_REPOSITORY, STATISTICS, TRACE, LOGGING = CATEGORIES[5:]

#: gRPC metadata keys of ``--grpc-restricted-protocol`` carry this prefix before the key.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

#: category -> (header, expected value)
Table = Mapping[str, tuple[str, str]]


def parse_groups(
    values: Sequence[str], option: str, feature: str, prefix: str = ""
) -> dict[str, tuple[str, str]]:
    """The category table of every ``<categories>:<key>=<value>`` value of ``--<option>``;
    ``feature`` ("api" or "protocol") names them in errors, ``prefix`` goes before each key.
    ``ValueError`` with tritonserver's text on a malformed value, an unknown category, or a
    category in two groups."""
    table: dict[str, tuple[str, str]] = {}
    for text in values:
        names, colon, setting = text.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and names and key and value):
            raise ValueError(
                f"--{option} option format is '<config name>:<setting>=<value>'. Got {text}"
            )
        for name in names.split(","):
            if name not in CATEGORIES:
                raise ValueError(f"unknown restricted {feature} '{name}'")
            if name in table:
                raise ValueError(
                    f"restricted {feature} '{name}' can not be specified in multiple config "
                    "groups"
                )
            table[name] = (prefix + key, value)
    return table


class Restrictions:
    """One transport's restricted categories: tells whether a request may go on."""

    def __init__(self, table: Table, refusal: str) -> None:
        """``refusal``: the message, with ``{header}`` where the expected header goes."""
        self._table = dict(table)
        self._refusal = refusal

    def __bool__(self) -> bool:
        return bool(self._table)

    def refusal(
        self, category: str | None, header: Callable[[str], str | None]
    ) -> Restricted | None:
        """The error to answer a request of ``category`` with (None: let it through);
        ``header(name)`` is the value the request sent for a header, None if it sent none."""
        if category is None:
            return None
        expected = self._table.get(category)
        if expected is None:
            return None
        name, value = expected
        if header(name) == value:
            return None
        return Restricted(self._refusal.format(header=name))


def for_http(table: Table) -> Restrictions:
    """``--http-restricted-api``'s restrictions, refused with Triton's HTTP text."""
    return Restrictions(table, "This API is restricted, expecting header '{header}'")


def for_grpc(table: Table) -> Restrictions:
    """``--grpc-restricted-protocol``'s restrictions, refused with Triton's gRPC text."""
    return Restrictions(table, "This protocol is restricted, expecting header '{header}'")
