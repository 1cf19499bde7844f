"""Cores this process may use: its CPU affinity, capped by its container's CPU quota.

In a Kubernetes pod with ``limits.cpu: 2`` the affinity still lists every core of the node, so
a default taken from it alone would start a front end per node core, each throttled by the
quota. The quota is read from the cgroup (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` and
``cpu.cfs_period_us``) of this process.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def usable_cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The affinity's core count, lowered to the quota rounded up when a quota is set."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(root, proc_cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def cpu_quota(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPU quota in cores, or None when there is none (or no cgroup can be read)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    v2_path, v1_path = "/", "/"
    for line in lines:
        _id, _sep, rest = line.partition(":")
        controllers, _sep, path = rest.partition(":")
        if controllers == "":
            v2_path = path or "/"
        elif "cpu" in controllers.split(","):
            v1_path = path or "/"
    for folder in _candidates(root, v2_path):
        try:
            return _read_v2(folder / "cpu.max")
        except OSError:  # not here: the next place
            continue
    for mount in _V1_CPU_MOUNTS:
        for folder in _candidates(root / mount, v1_path):
            try:
                return _read_v1(folder)
            except OSError:
                continue
    return None


def _candidates(base: Path, path: str) -> list[Path]:
    """The cgroup's own folder, then the mount's root (where a cgroup namespace puts it)."""
    own = base / path.lstrip("/")
    return [own] if own == base else [own, base]


def _read_v2(file: Path) -> float | None:
    """Raises OSError when the file is not there."""
    quota, _sep, period = file.read_text().strip().partition(" ")
    if quota == "max":
        return None
    try:
        return int(quota) / int(period or "100000")
    except ValueError:
        return None


def _read_v1(folder: Path) -> float | None:
    """Raises OSError when the files are not there."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period
