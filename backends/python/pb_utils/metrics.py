"""``MetricFamily`` and ``Metric``: a python model's own Prometheus metrics on ``/metrics``.

A family is made once (usually in ``initialize``) with a name, a description and a kind;
``family.Metric(labels={...})`` gives the series of those labels. Counters only go up
(``increment``), gauges also ``set``, histograms (made with ``buckets=[...]``) ``observe``.
Two families of one name share their series when their kind is the same. A misuse raises
``TritonModelException``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from backends.python.pb_utils.errors import TritonModelException
from server.observability import custom_metrics
from server.observability.custom_metrics import CustomFamily, MetricError, MetricSample


class MetricFamily:
    """``MetricFamily(name=..., description=..., kind=MetricFamily.COUNTER)``."""

    COUNTER = custom_metrics.COUNTER
    GAUGE = custom_metrics.GAUGE
    HISTOGRAM = custom_metrics.HISTOGRAM

    def __init__(self, name: str, description: str, kind: str) -> None:
        try:
            self._family = custom_metrics.REGISTRY.family(name, description, kind)
        except MetricError as exc:
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        """The series of ``labels`` in this family (``buckets`` for a histogram)."""
        if labels is not None and not isinstance(labels, Mapping):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None and not isinstance(buckets, list | tuple):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        try:
            sample = self._family.series(labels or {}, buckets)
        except MetricError as exc:
            raise TritonModelException(f"Failed to create metric. {exc}") from None
        return Metric(self._family, sample)


class Metric:
    """One labelled series of a family."""

    def __init__(self, family: CustomFamily, sample: MetricSample) -> None:
        self._family = family
        self._sample = sample

    def increment(self, value: float) -> None:
        self._do("increment", lambda: self._family.increment(self._sample, value))

    def set(self, value: float) -> None:
        self._do("set", lambda: self._family.set(self._sample, value))

    def observe(self, value: float) -> None:
        self._do("observe", lambda: self._family.observe(self._sample, value))

    def value(self) -> float:
        result: list[float] = []
        self._do("get", lambda: result.append(self._family.value(self._sample)))
        return result[0]

    @staticmethod
    def _do(what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except MetricError as exc:
            raise TritonModelException(f"Failed to {what} metric value: {exc}") from None
