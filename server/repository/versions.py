"""Version folders and Triton's version policy (latest N, all, specific)."""

from __future__ import annotations

from pathlib import Path

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc

#: Versions are int64 in Triton's protocol and configs.
MAX_VERSION = 2**63 - 1


def folder_version(name: str) -> int | None:
    """The version a folder name stands for: a canonical positive integer that fits an int64
    (``007``, ``0``, ``-1``, ``1e3``, ``+1``, non-ASCII digits and 2**63 are none)."""
    if not (name.isascii() and name.isdigit()) or name.startswith("0"):
        return None
    number = int(name)
    return number if number <= MAX_VERSION else None


def request_version(text: str) -> int | None:
    """The version a request names (None: ``""``, the newest ready one), read as Triton reads
    it: an integer, leading zeros allowed; anything else is refused with Triton's texts."""
    if not text:
        return None
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19 or int(text) > MAX_VERSION:
        raise InvalidArgument(
            f"failed to get model version from specified version string '{text[:200]}' "
            "(details: stol), version should be an integral value > 0"
        )
    number = int(text)
    if number < 0:
        raise InvalidArgument(
            f"invalid model version specified '{text}' , version should be an integral value > 0"
        )
    return number


def available_versions(model_dir: Path) -> list[int]:
    """Version folders, ascending; other entries (files, other names) are not versions."""
    versions = []
    for entry in model_dir.iterdir():
        number = folder_version(entry.name)
        if number is not None and entry.is_dir():
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
