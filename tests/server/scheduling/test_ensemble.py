"""The ensemble scheduler with a fake step runner: steps start once their inputs exist and
run at once when independent, unneeded steps are skipped, ``max_inflight_requests`` caps a
step, a step's error keeps its kind and gains Triton's prefix, and statistics add up."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import pytest

from server import event_loop
from server.errors import InvalidArgument
from server.observability.statistics import ModelStats
from server.scheduling.ensemble import EnsemblePlan, EnsembleScheduler, EnsembleStep, StepResult
from server.scheduling.job import Job


class Runner:
    """Each model adds 1 to its input ``X`` after ``delay`` seconds; counts concurrency."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.calls: list[str] = []
        self.running = 0
        self.most = 0

    async def __call__(
        self, model_name: str, model_version: str, inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str], request_id: str, parameters: Mapping[str, Any],
    ) -> StepResult:
        self.calls.append(model_name)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay)
            if model_name == "bad":
                raise InvalidArgument("unexpected shape")
            total = cast(np.ndarray, sum(inputs.values()))
            return StepResult({"Y": total + 1}, 1, 10, 100)
        finally:
            self.running -= 1


def _step(model: str, inputs: dict[str, str], output: str) -> EnsembleStep:
    return EnsembleStep(model, "", inputs, {"Y": output})


DIAMOND = (
    _step("left", {"X": "IN"}, "l"),
    _step("right", {"X": "IN"}, "r"),
    _step("join", {"A": "l", "B": "r"}, "OUT"),
    _step("unused", {"X": "IN"}, "EXTRA"),
)


def _run(plan: EnsemblePlan, runner: Runner, outputs: list[str], rows: int = 2) -> Any:
    stats = ModelStats()
    job = Job({"IN": np.zeros((rows, 1))}, outputs, rows=rows)
    result = event_loop.run(EnsembleScheduler(plan, runner, stats).execute(job))
    return result, job, stats


def test_independent_steps_run_at_once_and_unneeded_ones_not_at_all() -> None:
    runner = Runner()
    result, job, stats = _run(EnsemblePlan("e", DIAMOND), runner, ["OUT"])
    np.testing.assert_array_equal(result["OUT"], np.full((2, 1), 3.0))
    assert sorted(runner.calls) == ["join", "left", "right"]
    assert runner.most == 2
    assert job.times.breakdown == (3, 30, 300)
    assert stats.execution_count == 1 and list(stats.batch_stats) == [2]


def test_max_inflight_requests_caps_each_step() -> None:
    runner = Runner(0.02)
    plan = EnsemblePlan("e", (_step("only", {"X": "IN"}, "OUT"),), max_inflight=1)

    async def main() -> None:
        scheduler = EnsembleScheduler(plan, runner, ModelStats())
        await asyncio.gather(
            *(scheduler.execute(Job({"IN": np.zeros((1, 1))}, ["OUT"])) for _ in range(4))
        )

    event_loop.run(main())
    assert runner.calls == ["only"] * 4 and runner.most == 1


def test_a_step_error_keeps_its_kind_with_the_ensemble_prefix() -> None:
    plan = EnsemblePlan("e", (_step("bad", {"X": "IN"}, "OUT"),))
    with pytest.raises(InvalidArgument, match="^in ensemble 'e', unexpected shape$"):
        _run(plan, Runner(), ["OUT"])
