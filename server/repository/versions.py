"""Version folders and Triton's version policy (latest N, all, specific)."""

from __future__ import annotations

from pathlib import Path

from server.generated import model_config_pb2 as mc


def parse_version(version: str) -> int | None:
    """A version string as a number; None unless it is 1-19 ASCII digits (fits an int64)."""
    if 0 < len(version) <= 19 and version.isascii() and version.isdigit():
        return int(version)
    return None


def available_versions(model_dir: Path) -> list[int]:
    """Numeric version folders, ascending. Names starting with "0" are ignored, as in Triton."""
    versions = []
    for entry in model_dir.iterdir():
        number = parse_version(entry.name)
        if entry.is_dir() and number is not None and not entry.name.startswith("0"):
            versions.append(number)
    return sorted(versions)


def select_versions(policy: mc.ModelVersionPolicy, available: list[int]) -> list[int]:
    """The versions the policy asks to serve (specific versions may be missing: see caller)."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(available)
    if choice == "specific":
        return sorted(set(policy.specific.versions))
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-max(count, 1) :] if available else []
