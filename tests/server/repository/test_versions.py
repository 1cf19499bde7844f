"""Unit tests for server.repository.versions: version folders and the version policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc
from server.repository.versions import (
    MAX_VERSION,
    available_versions,
    folder_version,
    request_version,
    select_versions,
)


def _policy(text: str) -> mc.ModelVersionPolicy:
    return text_format.Parse(text, mc.ModelVersionPolicy())


def _make(root: Path, *names: str, files: tuple[str, ...] = ()) -> Path:
    for name in names:
        (root / name).mkdir()
    for name in files:
        (root / name).write_text("")
    return root


def test_numeric_folders_ascending(tmp_path: Path) -> None:
    _make(tmp_path, "3", "1", "10", "2")
    assert available_versions(tmp_path) == [1, 2, 3, 10]


def test_names_starting_with_zero_ignored(tmp_path: Path) -> None:
    _make(tmp_path, "0", "01", "007", "5")
    assert available_versions(tmp_path) == [5]


@pytest.mark.parametrize(
    "name", ["v1", "1a", "-1", "1.0", " 1", "latest", "\u0661", "\u00b2", "+2"]
)
def test_non_numeric_folders_ignored(tmp_path: Path, name: str) -> None:
    _make(tmp_path, name, "4")
    assert available_versions(tmp_path) == [4]


def test_numeric_files_ignored(tmp_path: Path) -> None:
    _make(tmp_path, "2", files=("1", "3", "config.pbtxt"))
    assert available_versions(tmp_path) == [2]


def test_empty_model_folder(tmp_path: Path) -> None:
    assert available_versions(tmp_path) == []


def test_large_version_numbers(tmp_path: Path) -> None:
    _make(tmp_path, "20240101", "99")
    assert available_versions(tmp_path) == [99, 20240101]


def test_versions_past_int64_are_not_versions(tmp_path: Path) -> None:
    _make(tmp_path, str(MAX_VERSION), str(MAX_VERSION + 1), "9" * 40, "3")
    assert available_versions(tmp_path) == [3, MAX_VERSION]


@pytest.mark.parametrize(
    "name", ["007", "0", "-1", "1e3", "+1", "1_000", "\uff11", "\u0661", "", "9223372036854775808"]
)
def test_folder_version_takes_canonical_int64s_only(name: str) -> None:
    assert folder_version(name) is None
    assert folder_version("7") == 7


# ---- request_version ------------------------------------------------------------------------

UNREADABLE = "failed to get model version from specified version string"


@pytest.mark.parametrize("text, number", [("", None), ("1", 1), ("007", 7), ("+3", 3), ("0", 0)])
def test_request_versions_read_as_triton(text: str, number: int | None) -> None:
    assert request_version(text) == number


@pytest.mark.parametrize(
    "text", ["abc", "1abc", "1.0", " 1", "\u0661", "9223372036854775808", "9" * 5000, "--1"]
)
def test_request_versions_that_are_no_int64_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        request_version(text)
    assert caught.value.message.startswith(f"{UNREADABLE} '")
    assert caught.value.message.endswith(
        "(details: stol), version should be an integral value > 0"
    )


def test_negative_request_versions_are_refused_with_tritons_text() -> None:
    with pytest.raises(InvalidArgument) as caught:
        request_version("-4")
    assert caught.value.message == (
        "invalid model version specified '-4' , version should be an integral value > 0"
    )


# ---- select_versions ------------------------------------------------------------------------


def test_latest_one_by_default() -> None:
    assert select_versions(mc.ModelVersionPolicy(), [1, 2, 7]) == [7]


@pytest.mark.parametrize("count,expected", [(1, [7]), (2, [2, 7]), (3, [1, 2, 7]), (10, [1, 2, 7])])
def test_latest_n(count: int, expected: list[int]) -> None:
    policy = _policy(f"latest {{ num_versions: {count} }}")
    assert select_versions(policy, [1, 2, 7]) == expected


def test_latest_with_nothing_available() -> None:
    assert select_versions(_policy("latest { num_versions: 2 }"), []) == []
    assert select_versions(mc.ModelVersionPolicy(), []) == []


def test_all() -> None:
    assert select_versions(_policy("all { }"), [1, 2, 7]) == [1, 2, 7]
    assert select_versions(_policy("all { }"), []) == []


def test_specific_sorted_and_deduplicated() -> None:
    policy = _policy("specific { versions: [ 7, 1, 7 ] }")
    assert select_versions(policy, [1, 2, 7]) == [1, 7]


def test_specific_may_name_missing_versions() -> None:
    # the caller reports a missing version as unavailable
    policy = _policy("specific { versions: [ 2, 5 ] }")
    assert select_versions(policy, [1, 2]) == [2, 5]


def test_result_is_a_new_list() -> None:
    available = [1, 2]
    selected = select_versions(_policy("all { }"), available)
    selected.append(3)
    assert available == [1, 2]
