"""Usable cores: the affinity, capped by the cgroup CPU quota of a container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from server.cpu_quota import cpu_quota, usable_cores


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def eight_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))


def test_v2_quota_in_a_cgroup_namespace(tmp_path: Path, eight_cores: None) -> None:
    _write(tmp_path / "proc", "0::/\n")
    _write(tmp_path / "cg" / "cpu.max", "250000 100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") == 2.5
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == 3  # rounded up


def test_v2_quota_of_the_process_own_cgroup(tmp_path: Path, eight_cores: None) -> None:
    _write(tmp_path / "proc", "0::/kubepods/pod1/c1\n")
    _write(tmp_path / "cg" / "cpu.max", "max 100000\n")  # the root has none
    _write(tmp_path / "cg" / "kubepods" / "pod1" / "c1" / "cpu.max", "200000 100000\n")
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == 2


def test_v2_without_a_limit(tmp_path: Path, eight_cores: None) -> None:
    _write(tmp_path / "proc", "0::/\n")
    _write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") is None
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == 8


def test_v1_quota(tmp_path: Path, eight_cores: None) -> None:
    _write(tmp_path / "proc", "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    folder = tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc"
    _write(folder / "cpu.cfs_quota_us", "50000\n")
    _write(folder / "cpu.cfs_period_us", "100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") == 0.5
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == 1  # never below one


def test_v1_unlimited_and_no_cgroup_at_all(tmp_path: Path, eight_cores: None) -> None:
    _write(tmp_path / "proc", "1:cpu:/\n")
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") is None
    assert cpu_quota(tmp_path / "none", tmp_path / "missing") is None
    assert usable_cores(tmp_path / "none", tmp_path / "missing") == 8


def test_the_quota_never_raises_the_affinity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    _write(tmp_path / "proc", "0::/\n")
    _write(tmp_path / "cg" / "cpu.max", "1600000 100000\n")
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == 2
