"""``use_batch_policy``: every thread of the process, those already running and those started
after, ends up under SCHED_BATCH (checked in a fresh interpreter: the test process keeps its
policy); a policy the process was started under on purpose is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from server.processes import cpu_policy
from tests.server_process import ROOT

_PROBE = """
import json, os, threading
from server.processes.cpu_policy import use_batch_policy
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # started under the default
release = threading.Event()
before = threading.Thread(target=release.wait)
before.start()
taken = use_batch_policy()
seen = {}
after = threading.Thread(target=lambda: seen.update(after=os.sched_getscheduler(0)))
after.start()
after.join()
seen["main"] = os.sched_getscheduler(0)
seen["before"] = os.sched_getscheduler(before.native_id)
release.set()
before.join()
print(json.dumps({"taken": taken, **seen}))
"""


def _probe(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (whose policy it may change)."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=True,
    )
    return result.stdout


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's SCHED_BATCH policy")
def test_threads_before_and_after_take_the_batch_policy() -> None:
    seen = json.loads(_probe(_PROBE))
    batch = os.SCHED_BATCH
    assert seen == {"taken": True, "main": batch, "before": batch, "after": batch}


def test_without_the_policy_the_process_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "SCHED_BATCH", raising=False)
    assert cpu_policy.use_batch_policy() is False


@pytest.mark.parametrize("call", ["sched_setscheduler", "sched_getscheduler"])
def test_a_refused_call_leaves_the_policy_as_it_is(
    monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A sandbox that refuses reading or setting the policy does not stop the process."""
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    before = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
    monkeypatch.setattr(os, call, refuse, raising=False)
    assert cpu_policy.use_batch_policy() is False
    monkeypatch.undo()
    if before is not None:
        assert os.sched_getscheduler(0) == before


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's SCHED_BATCH policy")
def test_a_policy_chosen_for_the_server_is_kept() -> None:
    """Started under SCHED_IDLE (as ``chrt --idle 0`` would), the process stays there."""
    probe = (
        "import os\n"
        "from server.processes.cpu_policy import use_batch_policy\n"
        "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
        "print(use_batch_policy(), os.sched_getscheduler(0) == os.SCHED_IDLE)\n"
    )
    assert _probe(probe).split() == ["False", "True"]
