"""Metric families that models define themselves (a python model's ``pb_utils.MetricFamily``).

They live in the process that runs the models (the executor, which also serves ``/metrics``)
and are appended to the page after Triton's own families, under the names and labels the
model chose. Models update them from their instances' threads while a scrape reads them on
the event loop, so every access takes the registry's lock.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

Labels = tuple[tuple[str, str], ...]


class MetricError(ValueError):
    """A use of a metric its kind does not allow, or a bad name."""


@dataclass
class MetricSample:
    """One labelled series: a value, or for a histogram its bucket counts, sum and count."""

    labels: Labels
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)  # per bucket, then +Inf; not cumulative


@dataclass
class FamilySnapshot:
    name: str
    description: str
    kind: str
    samples: list[MetricSample]


class CustomFamily:
    """One family: its kind, text and labelled series (a series shared by equal labels)."""

    def __init__(self, registry: CustomMetrics, name: str, description: str, kind: str) -> None:
        self._registry = registry
        self.name = name
        self.description = description
        self.kind = kind
        self._samples: dict[Labels, MetricSample] = {}

    def series(
        self, labels: Mapping[str, str], buckets: Sequence[float] | None
    ) -> MetricSample:
        """The series of ``labels`` (made on first use); ``buckets`` only for histograms."""
        key: Labels = tuple((str(k), str(v)) for k, v in labels.items())
        for label, _ in key:
            if not _LABEL.match(label):
                raise MetricError(f"invalid label name '{label}'")
        if self.kind == HISTOGRAM:
            if buckets is None:
                raise MetricError("Missing required buckets.")
            bounds = tuple(float(b) for b in buckets)
            if any(b >= c for b, c in itertools.pairwise(bounds)):
                raise MetricError("histogram buckets must be in increasing order")
        elif buckets is not None:
            raise MetricError("Unexpected buckets found.")
        else:
            bounds = ()
        with self._registry.lock:
            sample = self._samples.get(key)
            if sample is None:
                sample = MetricSample(key, bounds, counts=[0] * (len(bounds) + 1))
                self._samples[key] = sample
            elif sample.buckets != bounds:
                raise MetricError(
                    f"metric of family '{self.name}' with these labels has other buckets"
                )
            return sample

    def increment(self, sample: MetricSample, value: float) -> None:
        if self.kind == HISTOGRAM:
            raise MetricError("increment() is not supported for a histogram; use observe()")
        if self.kind == COUNTER and value < 0:
            raise MetricError("a counter cannot be decremented: the value must be >= 0")
        with self._registry.lock:
            sample.value += value

    def set(self, sample: MetricSample, value: float) -> None:
        if self.kind != GAUGE:
            raise MetricError(f"set() is supported for a gauge only, not a {self.kind}")
        with self._registry.lock:
            sample.value = float(value)

    def observe(self, sample: MetricSample, value: float) -> None:
        if self.kind != HISTOGRAM:
            raise MetricError(f"observe() is supported for a histogram only, not a {self.kind}")
        with self._registry.lock:
            sample.counts[bisect.bisect_left(sample.buckets, value)] += 1
            sample.value += value

    def value(self, sample: MetricSample) -> float:
        if self.kind == HISTOGRAM:
            raise MetricError("value() is not supported for a histogram")
        with self._registry.lock:
            return sample.value

    def remove(self, sample: MetricSample) -> None:
        with self._registry.lock:
            self._samples.pop(sample.labels, None)

    def snapshot(self) -> FamilySnapshot:
        """A copy to render (taken under the registry's lock)."""
        samples = [
            MetricSample(s.labels, s.buckets, s.value, list(s.counts))
            for s in self._samples.values()
        ]
        return FamilySnapshot(self.name, self.description, self.kind, samples)


class CustomMetrics:
    """The families of one process, by name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._families: dict[str, CustomFamily] = {}

    def family(self, name: str, description: str, kind: str) -> CustomFamily:
        """The family ``name``: made, or the existing one when its kind is the same."""
        if not _NAME.match(name):
            raise MetricError(f"invalid metric family name '{name}'")
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise MetricError("Unknown metric kind")
        with self.lock:
            found = self._families.get(name)
            if found is None:
                found = CustomFamily(self, name, description, kind)
                self._families[name] = found
            elif found.kind != kind:
                raise MetricError(
                    f"metric family '{name}' already exists as a {found.kind}, not a {kind}"
                )
            return found

    def remove(self, family: CustomFamily) -> None:
        with self.lock:
            if self._families.get(family.name) is family:
                del self._families[family.name]

    def snapshot(self) -> list[FamilySnapshot]:
        with self.lock:
            return [family.snapshot() for family in self._families.values()]


#: The process's registry: models create families without a handle to anything.
REGISTRY = CustomMetrics()
