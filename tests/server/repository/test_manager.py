"""Unit tests for server.repository.manager.ModelRepository, in process on small temporary
repositories: the index and its states (LOADING, READY, UNLOADING, UNAVAILABLE), load, reload
and unload with requests inside a version's gate, file overrides, readiness, and poll_once."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import pytest

from backends.onnxruntime.backend import OnnxRuntimeBackend
from scripts import make_models
from server import event_loop
from server.errors import InvalidArgument, ModelLoadError, NotFound, Unavailable
from server.generated import model_config_pb2 as mc
from server.repository import manager as manager_module
from server.repository.loader import State, load_model
from server.repository.manager import ModelRepository
from server.scheduling.job import Job
from server.settings import Settings
from tests.server.repository.lifecycle_helpers import add_identity, bump_mtimes

T = TypeVar("T")
BACKENDS = {"onnxruntime": OnnxRuntimeBackend({"intra_op_thread_count": "1"})}
REAL_LOAD_MODEL = load_model


def run(coro: Coroutine[Any, Any, T]) -> T:
    return event_loop.run(coro)


def add_add_sub(root: Path, name: str) -> Path:
    make_models.save(make_models.add_sub("FP32", 4), root / name / "1" / "model.onnx")
    return root / name


def corrupt(folder: Path) -> None:
    (folder / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    bump_mtimes(folder)


def repository(root: Path, mode: str = "explicit") -> ModelRepository:
    settings = Settings(model_repositories=(str(root),), model_control_mode=mode)
    return ModelRepository(settings, BACKENDS)


async def identity_works(repo: ModelRepository, name: str) -> bool:
    served = repo.version(name, "")
    assert served.scheduler is not None
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = await served.scheduler.execute(Job({"INPUT0": data}, ["OUTPUT0"], rows=data.shape[0]))
    return bool(np.array_equal(out["OUTPUT0"], data))


class GatedLoads:
    """Replaces the manager's ``load_model``: every load waits for ``release`` (on its worker
    thread) so that a test can look at the repository while loads are in progress."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        self.started.release()
        try:
            assert self.release.wait(30), "the test never released the load"
            return REAL_LOAD_MODEL(*args, **kwargs)
        finally:
            with self._lock:
                self.inside -= 1

    async def wait_started(self, count: int = 1) -> None:
        for _ in range(count):
            assert await asyncio.to_thread(self.started.acquire, True, 10), "load did not start"


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedLoads]:
    gate = GatedLoads()
    monkeypatch.setattr(manager_module, "load_model", gate)
    yield gate
    gate.release.set()


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


# ---- index and load -------------------------------------------------------------------------


def test_index_lists_unloaded_models_by_name_only(repo_root: Path) -> None:
    add_identity(repo_root, "a")
    add_identity(repo_root, "b")

    async def scenario() -> None:
        repo = repository(repo_root)
        assert repo.index(ready_only=False) == [{"name": "a"}, {"name": "b"}]
        assert repo.index(ready_only=True) == []
        await repo.load("a")
        assert repo.index(ready_only=False) == [
            {"name": "a", "version": "1", "state": "READY", "reason": ""},
            {"name": "b"},
        ]
        assert repo.index(ready_only=True) == [
            {"name": "a", "version": "1", "state": "READY", "reason": ""}
        ]
        await repo.close()

    run(scenario())


def test_load_initial_loads_the_names_given_or_all(repo_root: Path) -> None:
    for name in ("a", "b", "c"):
        add_identity(repo_root, name)

    async def scenario() -> None:
        some = repository(repo_root)
        await some.load_initial(["b"])
        assert sorted(some.models) == ["b"]
        await some.close()
        every = repository(repo_root)
        await every.load_initial(None)
        assert sorted(every.models) == ["a", "b", "c"]
        assert every.all_ready()
        await every.close()
        missing = repository(repo_root)
        with pytest.raises(ModelLoadError, match="failed to poll from model repository"):
            await missing.load_initial(["nope"])

    run(scenario())


def test_states_go_loading_then_ready(repo_root: Path, gated: GatedLoads) -> None:
    add_identity(repo_root, "m")

    async def scenario() -> None:
        repo = repository(repo_root)
        task = asyncio.create_task(repo.load("m"))
        await gated.wait_started()
        assert repo.index(ready_only=False) == [{"name": "m", "state": "LOADING"}]
        assert repo.index(ready_only=True) == []
        assert not repo.is_ready("m", "")
        assert not repo.all_ready()  # a wanted model is still loading
        gated.release.set()
        await task
        assert repo.index(ready_only=False) == [
            {"name": "m", "version": "1", "state": "READY", "reason": ""}
        ]
        assert repo.is_ready("m", "") and repo.is_ready("m", "1")
        assert repo.all_ready()
        assert await identity_works(repo, "m")
        await repo.close()

    run(scenario())


def test_several_models_load_at_once(repo_root: Path, gated: GatedLoads) -> None:
    for name in ("a", "b", "c"):
        add_identity(repo_root, name)

    async def scenario() -> None:
        repo = repository(repo_root)
        task = asyncio.create_task(repo.load_initial(None))
        await gated.wait_started(3)  # all three are inside load_model together
        assert gated.most_inside == 3
        assert [e["state"] for e in repo.index(ready_only=False)] == ["LOADING"] * 3
        gated.release.set()
        await task
        assert repo.all_ready()
        await repo.close()

    run(scenario())


def test_loading_unknown_or_bad_names(repo_root: Path) -> None:
    add_identity(repo_root, "a")

    async def scenario() -> None:
        repo = repository(repo_root)
        with pytest.raises(ModelLoadError) as caught:
            await repo.load("model..1")
        assert caught.value.message == (
            "failed to load 'model..1', failed to poll from model repository"
        )
        for name in ("../a", "a/../a", "/etc/passwd", " .."):
            with pytest.raises(InvalidArgument, match="path traversal characters"):
                await repo.load(name)
        with pytest.raises(InvalidArgument, match="cannot be empty"):
            await repo.load(" ")
        assert repo.index(ready_only=False) == [{"name": "a"}]
        assert repo.all_ready()  # refused loads do not make anything wanted

    run(scenario())


def test_lookups_raise_tritons_errors(repo_root: Path) -> None:
    add_identity(repo_root, "m")

    async def scenario() -> None:
        repo = repository(repo_root)
        with pytest.raises(InvalidArgument, match="Request for unknown model: 'm' is not found"):
            repo.version("m", "")
        await repo.load("m")
        assert repo.version("m", "1").version == 1
        with pytest.raises(NotFound, match="'m' version 2 is not found"):
            repo.version("m", "2")
        await repo.close()

    run(scenario())


def test_corrupt_model_fails_with_its_reason_and_others_stay(repo_root: Path) -> None:
    add_identity(repo_root, "good")
    corrupt(add_identity(repo_root, "bad"))

    async def scenario() -> None:
        repo = repository(repo_root)
        await repo.load("good")
        with pytest.raises(ModelLoadError, match="failed to load 'bad'"):
            await repo.load("bad")
        (entry,) = [e for e in repo.index(ready_only=False) if e["name"] == "bad"]
        assert entry["state"] == "UNAVAILABLE"
        assert "bad" in entry["reason"] and entry["reason"]
        assert not repo.all_ready()  # wanted, not ready
        assert [m.name for m in repo.failed_models()] == ["bad"]
        assert await identity_works(repo, "good")
        await repo.unload("bad")
        assert repo.all_ready()
        await repo.close()

    run(scenario())


# ---- reload -----------------------------------------------------------------------------------


def test_reload_keeps_serving_the_old_version_then_switches(
    repo_root: Path, gated: GatedLoads
) -> None:
    add_identity(repo_root, "m", max_batch_size=4)

    async def scenario() -> None:
        repo = repository(repo_root)
        gated.release.set()
        await repo.load("m")
        old = repo.version("m", "1")
        assert old.config is not None and old.config.max_batch_size == 4
        gated.release.clear()
        override = mc.ModelConfig(max_batch_size=2)
        task = asyncio.create_task(repo.load("m", override))
        await gated.wait_started()
        # while the new version loads, the old one serves and the model is ready
        assert repo.version("m", "1") is old
        assert repo.is_ready("m", "1")
        assert not old.gate.closed
        assert repo.index(ready_only=False) == [
            {"name": "m", "version": "1", "state": "READY", "reason": ""}
        ]
        with old.gate.admit():  # a request admitted to the old version before the switch
            gated.release.set()
            while repo.version("m", "1") is old:
                await asyncio.sleep(0.01)
            new = repo.version("m", "1")
            assert new.config is not None and new.config.max_batch_size == 2
            assert old.gate.closed  # new requests go to the new version only
            with pytest.raises(Unavailable), old.gate.admit():
                pass
            await asyncio.sleep(0.05)
            assert not task.done()  # the reload waits for the admitted request
            assert old.scheduler is not None
        await task
        assert old.scheduler is None  # released once its request was answered
        assert await identity_works(repo, "m")
        await repo.close()

    run(scenario())


def test_server_stays_ready_while_a_serving_model_reloads(
    repo_root: Path, gated: GatedLoads
) -> None:
    """Strict readiness: every wanted model has a READY version during a reload (the old one
    serves), so the server must not turn unready (Triton reports the serving versions)."""
    add_identity(repo_root, "m")

    async def scenario() -> None:
        repo = repository(repo_root)
        gated.release.set()
        await repo.load("m")
        assert repo.all_ready()
        gated.release.clear()
        task = asyncio.create_task(repo.load("m"))
        await gated.wait_started()
        try:
            assert repo.is_ready("m", "")
            assert repo.all_ready(), "server readiness dropped during the reload of 'm'"
        finally:
            gated.release.set()
            await task
        await repo.close()

    run(scenario())


def test_failed_reload_keeps_the_old_version_serving(repo_root: Path) -> None:
    folder = add_identity(repo_root, "m")

    async def scenario() -> None:
        repo = repository(repo_root)
        await repo.load("m")
        old = repo.version("m", "1")
        corrupt(folder)
        with pytest.raises(ModelLoadError, match="failed to load 'm'"):
            await repo.load("m")
        assert repo.version("m", "1") is old
        assert old.state is State.READY and old.scheduler is not None
        assert not old.gate.closed
        assert repo.index(ready_only=True) == [
            {"name": "m", "version": "1", "state": "READY", "reason": ""}
        ]
        assert repo.all_ready()
        assert await identity_works(repo, "m")
        # a config override that does not fit the model fails the same way
        with pytest.raises(ModelLoadError):
            await repo.load("m", mc.ModelConfig(max_batch_size=-3))
        assert repo.version("m", "1") is old
        await repo.close()

    run(scenario())


# ---- unload ---------------------------------------------------------------------------------


def test_unload_waits_for_admitted_requests_and_refuses_new_ones(repo_root: Path) -> None:
    add_identity(repo_root, "m")

    async def scenario() -> None:
        repo = repository(repo_root)
        await repo.load("m")
        served = repo.version("m", "1")
        with served.gate.admit():
            task = asyncio.create_task(repo.unload("m"))
            for _ in range(5):
                await asyncio.sleep(0.01)
            assert not task.done()
            assert served.state is State.UNLOADING
            assert repo.index(ready_only=False) == [
                {"name": "m", "version": "1", "state": "UNLOADING", "reason": ""}
            ]
            assert repo.index(ready_only=True) == []
            assert not repo.is_ready("m", "1")
            # new requests are refused with 503 while the admitted ones finish
            with pytest.raises(Unavailable):
                repo.version("m", "")
            with pytest.raises(Unavailable):
                repo.version("m", "1")
            with pytest.raises(Unavailable), served.gate.admit():
                pass
            assert served.scheduler is not None  # still there for the admitted request
        await task
        assert cast(State, served.state) is State.UNAVAILABLE and served.reason == "unloaded"
        assert served.scheduler is None
        assert repo.index(ready_only=False) == [
            {"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
        assert repo.all_ready()  # no longer wanted
        with pytest.raises(NotFound):
            repo.version("m", "1")
        await repo.unload("m")  # unloading again does nothing
        await repo.unload("never-loaded")
        # and it loads again
        await repo.load("m")
        assert repo.is_ready("m", "1") and await identity_works(repo, "m")
        await repo.close()

    run(scenario())


# ---- file overrides ------------------------------------------------------------------------


def test_file_override_loads_from_a_private_folder_removed_on_unload(
    repo_root: Path, private_tmp: Path, tmp_path: Path
) -> None:
    add_identity(repo_root, "m")
    other = add_add_sub(tmp_path / "elsewhere", "m")
    files = {"file:1/model.onnx": (other / "1" / "model.onnx").read_bytes()}
    repo_files_before = sorted(repo_root.rglob("*"))

    async def scenario() -> None:
        repo = repository(repo_root)
        await repo.load("m")
        await repo.load("m", mc.ModelConfig(), files)  # add_sub replaces identity
        served = repo.version("m", "1")
        assert served.spec is not None and sorted(served.spec.inputs) == ["INPUT0", "INPUT1"]
        (folder,) = private_tmp.iterdir()
        assert (folder / "m" / "1" / "model.onnx").read_bytes() == files["file:1/model.onnx"]
        assert repo.models["m"].path == folder / "m"
        # reloading from the repository folder drops the private folder
        await repo.load("m")
        assert list(private_tmp.iterdir()) == []
        served = repo.version("m", "1")
        assert served.spec is not None and sorted(served.spec.inputs) == ["INPUT0"]
        # a model only given as files, then unloaded
        await repo.load("only_files", mc.ModelConfig(), files)
        assert repo.is_ready("only_files", "1")
        assert len(list(private_tmp.iterdir())) == 1
        await repo.unload("only_files")
        assert list(private_tmp.iterdir()) == []
        # a failed reload from files leaves no folder and keeps the old version
        old = repo.version("m", "1")
        with pytest.raises(ModelLoadError):
            await repo.load("m", mc.ModelConfig(), {"file:1/model.onnx": b"garbage"})
        assert list(private_tmp.iterdir()) == []
        assert repo.version("m", "1") is old
        await repo.close()

    run(scenario())
    assert sorted(repo_root.rglob("*")) == repo_files_before


def test_escaping_file_override_is_refused(repo_root: Path, private_tmp: Path) -> None:
    add_identity(repo_root, "m")

    async def scenario() -> None:
        repo = repository(repo_root)
        for key in ("file:../x", "file:/abs", "file:1/../../x"):
            with pytest.raises(InvalidArgument, match="invalid file override path"):
                await repo.load("m", mc.ModelConfig(), {key: b"x"})
        assert list(private_tmp.iterdir()) == []
        assert repo.index(ready_only=False) == [{"name": "m"}]

    run(scenario())


# ---- poll_once -------------------------------------------------------------------------------


def test_poll_loads_new_models(repo_root: Path, tmp_path: Path) -> None:
    add_identity(repo_root, "a")

    async def scenario() -> None:
        repo = repository(repo_root, "poll")
        await repo.load_initial(None)
        add_identity(repo_root, "b")
        await repo.poll_once()
        assert repo.is_ready("b", "1") and repo.all_ready()
        await repo.close()

    run(scenario())


def test_poll_reloads_changed_models_only(repo_root: Path) -> None:
    changed = add_identity(repo_root, "changed", max_batch_size=4)
    add_identity(repo_root, "same", max_batch_size=4)

    async def scenario() -> None:
        repo = repository(repo_root, "poll")
        await repo.load_initial(None)
        same = repo.version("same", "1")
        make_models.write_text("max_batch_size: 2\n", changed / "config.pbtxt")
        bump_mtimes(changed)
        await repo.poll_once()
        config = repo.version("changed", "1").config
        assert config is not None and config.max_batch_size == 2
        assert repo.version("same", "1") is same  # untouched models are not reloaded
        await repo.close()

    run(scenario())


def test_poll_unloads_removed_models(repo_root: Path) -> None:
    add_identity(repo_root, "a")
    removed = add_identity(repo_root, "b")

    async def scenario() -> None:
        repo = repository(repo_root, "poll")
        await repo.load_initial(None)
        served = repo.version("b", "1")
        shutil.rmtree(removed)
        await repo.poll_once()
        assert not repo.is_ready("b", "")
        assert served.state is State.UNAVAILABLE and served.scheduler is None
        assert repo.is_ready("a", "1") and repo.all_ready()
        await repo.close()

    run(scenario())


def test_poll_keeps_the_old_version_when_new_files_are_broken(repo_root: Path) -> None:
    folder = add_identity(repo_root, "m")

    async def scenario() -> None:
        repo = repository(repo_root, "poll")
        await repo.load_initial(None)
        old = repo.version("m", "1")
        corrupt(folder)
        await repo.poll_once()
        assert repo.version("m", "1") is old and not old.gate.closed
        assert repo.all_ready()
        assert await identity_works(repo, "m")
        # fixed files are picked up by the next poll
        add_identity(repo_root, "m")
        bump_mtimes(folder)
        await repo.poll_once()
        assert repo.version("m", "1") is not old and repo.is_ready("m", "1")
        await repo.close()

    run(scenario())


def test_poll_loads_a_model_put_back_after_removal(repo_root: Path, tmp_path: Path) -> None:
    """Moved out of the repository (unloaded), then moved back unchanged (same mtimes, as
    ``mv`` or ``cp -a`` keep them): the model is served again, as Triton's poll does."""
    folder = add_identity(repo_root, "m")
    away = tmp_path / "away"
    away.mkdir()

    async def scenario() -> None:
        repo = repository(repo_root, "poll")
        await repo.load_initial(None)
        folder.rename(away / "m")
        await repo.poll_once()
        assert not repo.is_ready("m", "")
        (away / "m").rename(folder)
        await repo.poll_once()
        assert repo.is_ready("m", "1"), repo.index(ready_only=False)
        await repo.close()

    run(scenario())


def test_close_releases_every_model(repo_root: Path) -> None:
    add_identity(repo_root, "a")
    add_identity(repo_root, "b")

    async def scenario() -> None:
        repo = repository(repo_root)
        await repo.load_initial(None)
        versions = [repo.version(name, "1") for name in ("a", "b")]
        await repo.close()
        assert all(v.scheduler is None and v.gate.closed for v in versions)

    run(scenario())

