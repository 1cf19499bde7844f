"""Receiving a request body into one pooled buffer, and request/response compression.

The body is copied once, chunk by chunk, into a buffer sized from ``Content-Length`` before
reading starts (chunked bodies grow in size classes). Limits are checked before the bytes are
kept, and again after decompression.
"""

from __future__ import annotations

from server import compression
from server.errors import InvalidArgument, Unavailable, Unsupported
from server.memory.host_pool import BufferSource, PooledBuffer

_INITIAL_CHUNKED = 1 << 16
_ENCODINGS = ("gzip", "deflate")


def too_large(size: int, limit: int, binary: bool) -> InvalidArgument:
    """Triton's texts for a body over ``--http-max-input-size``."""
    if binary:
        return InvalidArgument(
            f"request body of {size} bytes exceeds the maximum allowed value of {limit} bytes. "
            "Use --http-max-input-size to increase the limit."
        )
    return InvalidArgument(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} "
        "bytes. Use --http-max-input-size to increase the limit."
    )


def parse_content_encoding(value: str | None) -> str | None:
    """The request's compression (gzip/deflate), None for identity; 501 for anything else."""
    if value is None:
        return None
    encoding = value.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in _ENCODINGS:
        return encoding
    raise Unsupported("Unsupported compression type")


def parse_content_length(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise InvalidArgument(f"invalid Content-Length: {value[:32]!r}")
    return int(text)


def admit(pool: BufferSource, nbytes: int, budget: int) -> None:
    """503 unless ``nbytes`` more fit in the bodies-in-flight budget."""
    if pool.bytes_in_use + nbytes > budget:
        raise Unavailable(
            f"the server is busy: request bodies in flight would exceed {budget} bytes "
            "(--http-max-inflight-bytes); retry later"
        )


class BodyReceiver:
    """Accumulates a request body in a pooled buffer, enforcing the size and chunk limits."""

    def __init__(
        self, pool: BufferSource, limit: int, content_length: int | None, budget: int
    ) -> None:
        """``budget`` is ``--http-max-inflight-bytes``: a chunked body grows only within it."""
        self._pool = pool
        self._limit = limit
        self._budget = budget
        self._fixed = content_length is not None
        self._buffer: PooledBuffer | None = pool.acquire(
            content_length if content_length is not None else _INITIAL_CHUNKED
        )
        self.received = 0

    def feed(self, chunk: bytes) -> None:
        """Copy one chunk in (the one host copy of the body)."""
        buffer = self._require()
        size = len(chunk)
        if not size:
            return
        end = self.received + size
        if not self._fixed:
            # Tornado coalesces small HTTP chunks before handing them over, so the number of
            # pieces per body is bounded by the size limit rather than by a chunk count.
            if end > self._limit:
                raise too_large(end, self._limit, binary=False)
            if end > buffer.capacity:
                buffer = self._grow(end)
        if end > len(buffer.view):
            buffer.resize(end)  # chunked: the view follows the data
        buffer.view[self.received : end] = chunk
        self.received = end

    def space(self) -> memoryview:
        """Where the rest of a body of known length goes (``BodySink``: read into in place)."""
        return self._require().view[self.received :]

    def filled(self, nbytes: int) -> None:
        self.received += nbytes

    def _grow(self, needed: int) -> PooledBuffer:
        old = self._require()
        size = max(needed, 2 * old.capacity)
        # The old buffer goes back as soon as the new one holds its bytes.
        admit(self._pool, self._pool.footprint(size) - old.capacity, self._budget)
        new = self._pool.acquire(size)
        new.view[: self.received] = old.view[: self.received]
        old.release()
        self._buffer = new
        return new

    def _require(self) -> PooledBuffer:
        if self._buffer is None:
            raise RuntimeError("body buffer used after release")
        return self._buffer

    def body(self) -> memoryview:
        return self._require().view[: self.received]

    def release(self) -> None:
        if self._buffer is not None:
            self._buffer.release()
            self._buffer = None


def decompress(data: memoryview, encoding: str, limit: int) -> bytes:
    """Inflate a gzip or zlib/deflate body, refusing output beyond ``limit`` bytes."""
    try:
        return compression.inflate(data, limit)
    except compression.TooLarge as exc:
        raise too_large(exc.size, limit, binary=False) from None
    except compression.Truncated:
        raise InvalidArgument(f"truncated {encoding} request body") from None
    except compression.InflateError:
        raise InvalidArgument(f"unable to decompress the {encoding} request body") from None


def choose_response_encoding(accept: str | None) -> str | None:
    """gzip or deflate when ``Accept-Encoding`` asks for one with q > 0 (gzip on a tie)."""
    if not accept:
        return None
    best: tuple[float, int, str] | None = None
    for item in accept.split(","):
        token, _, params = item.strip().partition(";")
        token = token.strip().lower()
        if token not in _ENCODINGS:
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                continue
        if q <= 0:
            continue
        rank = (q, 1 if token == "gzip" else 0, token)
        if best is None or rank > best:
            best = rank
    return best[2] if best else None
