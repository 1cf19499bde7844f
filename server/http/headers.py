"""A request's header fields, as the connection parsed them: looked up in one dict.

Tornado's ``HTTPHeaders`` costs a Python call per field to build (``__setitem__``) and two per
lookup (``get``, ``get_list``). perf_analyzer's infer request has six fields, and the
connection and the infer path make nine lookups and two membership tests: timed alone, that
took 5.1-8.9 µs with ``HTTPHeaders`` and takes half (2.5-4.3 µs) with a dict of lower-cased
names filled in one loop (in every front end, and in the protocol floor too). Tornado's
application, which reads headers every way ``HTTPHeaders`` allows, gets one built from the
same fields (``tornado``).
Values lose the spaces and tabs around them, as Tornado's own parser strips them (llhttp
leaves the trailing ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from tornado import httputil

_WHITESPACE = " \t"  # around a field's value (RFC 9110's OWS)


class RequestHeaders:
    """A request's fields by name in any case; a name sent more than once has its values
    joined with "," (what ``HTTPHeaders`` answers for it)."""

    __slots__ = ("_fields", "_tornado", "_values")

    def __init__(self, fields: Sequence[tuple[bytes, bytes]] = ()) -> None:
        values: dict[str, str] = {}
        for name, value in fields:
            key = name.decode("latin1").lower()
            text = value.decode("latin1").strip(_WHITESPACE)
            if key in values:
                values[key] += "," + text
            else:
                values[key] = text
        self._fields = fields
        self._values = values
        self._tornado: httputil.HTTPHeaders | None = None

    @overload
    def get(self, name: str) -> str | None: ...

    @overload
    def get(self, name: str, default: str) -> str: ...

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._values

    def tornado(self) -> httputil.HTTPHeaders:
        """The same fields as Tornado's ``HTTPHeaders``, each line kept (``get_list``); built
        once."""
        if self._tornado is None:
            headers = httputil.HTTPHeaders()
            for name, value in self._fields:
                key = name.decode("latin1")
                text = value.decode("latin1").strip(_WHITESPACE)
                if key in headers:
                    headers.add(key, text)
                else:
                    headers[key] = text
            self._tornado = headers
        return self._tornado
