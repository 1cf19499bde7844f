"""A request's headers: Tornado's ``HTTPHeaders``, with a ``get`` that costs one lookup.

``HTTPHeaders.get`` is ``Mapping.get``: ``__getitem__`` and, for an absent header, a
``KeyError`` raised and caught. An infer request asks for about eight headers, most of them
absent (``Content-Encoding``, ``Expect``, ``traceparent``...), so that was 16 calls and 5
exceptions per request, on every front end.
"""

from __future__ import annotations

from typing import Any

from tornado import httputil


class RequestHeaders(httputil.HTTPHeaders):
    def get(self, name: str, default: Any = None) -> Any:
        values = self.get_list(name)
        if not values:
            return default
        return values[0] if len(values) == 1 else ",".join(values)
