"""Every tritonserver 2.51 option and what tensorgate does with it, in one table.

A Triton launch line must never be half-obeyed in silence. Each option is one of:

- ``IMPLEMENTED``: defined in ``server.cli`` and working as in Triton;
- ``IGNORED``: accepted, and start-up logs one warning naming it: leaving it out cannot change
  what the operator asked for (a thread count, a plug-in folder, a setting of an endpoint that
  is off);
- ``REFUSED``: start-up stops (exit status 1) with one line naming it and what is missing,
  except for the values in ``harmless`` (the ones that ask for nothing, such as
  ``--allow-sagemaker=false``), which are accepted with the warning.

``server.cli`` adds every option that is not ``IMPLEMENTED`` to its parser from this table, so
values still parse as Triton's (``--http-thread-count=x`` is an error).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Support(enum.Enum):
    IMPLEMENTED = "implemented"
    IGNORED = "ignored"
    REFUSED = "refused"


@dataclass(frozen=True)
class Compat:
    """One option: how tensorgate treats it, how its value parses (``bool``, ``int``,
    ``float``, ``str``) and why (shown in the warning, the refusal and ``--help``)."""

    support: Support
    value: str = "str"
    why: str = ""
    harmless: tuple[str, ...] = ()  # REFUSED: values, as ``normalize`` writes them, accepted

    def normalize(self, value: object) -> str:
        """A parsed value as ``harmless`` lists it: booleans ``true``/``false``, numbers in
        decimal, text in lower case."""
        return _shown(value).strip().lower()


_IMPLEMENTED = Compat(Support.IMPLEMENTED)


def _ignored(value: str, why: str) -> Compat:
    return Compat(Support.IGNORED, value, why)


def _refused(value: str, why: str, *harmless: str) -> Compat:
    return Compat(Support.REFUSED, value, why, harmless)


_SAGEMAKER_OFF = "only the SageMaker endpoint uses it, and that endpoint is not served"
_VERTEX_OFF = "only the Vertex AI endpoint uses it, and that endpoint is not served"
_NO_RATE_LIMIT = "the rate limiter is not implemented"

#: Every option of ``tritonserver --help`` (2.51), plus ``--version``.
TRITON_FLAGS: dict[str, Compat] = {
    # Server, logging
    "--help": _IMPLEMENTED,
    "--version": _IMPLEMENTED,
    "--id": _IMPLEMENTED,
    "--exit-timeout-secs": _IMPLEMENTED,
    "--log-verbose": _IMPLEMENTED,
    "--log-info": _IMPLEMENTED,
    "--log-warning": _IMPLEMENTED,
    "--log-error": _IMPLEMENTED,
    "--log-format": _IMPLEMENTED,
    "--log-file": _IMPLEMENTED,
    # Model repository
    "--model-store": _IMPLEMENTED,
    "--model-repository": _IMPLEMENTED,
    "--exit-on-error": _IMPLEMENTED,
    "--disable-auto-complete-config": _IMPLEMENTED,
    "--strict-model-config": _IMPLEMENTED,  # deprecated: true = --disable-auto-complete-config
    "--strict-readiness": _IMPLEMENTED,
    "--model-control-mode": _IMPLEMENTED,
    "--repository-poll-secs": _IMPLEMENTED,
    "--load-model": _IMPLEMENTED,
    "--model-config-name": _IMPLEMENTED,
    "--model-load-thread-count": _ignored(
        "int", "tensorgate loads the start-up models itself, one after another"
    ),
    "--model-load-retry-count": _ignored(
        "int", "a model that fails to load is not loaded again (as with Triton's default, 0)"
    ),
    "--model-namespacing": _refused(
        "bool", "model namespacing (one model name in several repositories) is not implemented",
        "false",
    ),
    "--enable-peer-access": _ignored("bool", "tensorgate never copies from one GPU to another"),
    # HTTP
    "--allow-http": _IMPLEMENTED,
    "--http-address": _IMPLEMENTED,
    "--http-port": _IMPLEMENTED,
    "--reuse-http-port": _ignored(
        "bool", "the HTTP port is never shared with another server (a second one fails to bind)"
    ),
    "--http-header-forward-pattern": _refused(
        "str", "forwarding HTTP headers as request parameters is not implemented"
    ),
    "--http-thread-count": _ignored(
        "int", "HTTP is served by the front-end processes' event loops (see --frontends)"
    ),
    "--http-restricted-api": _IMPLEMENTED,
    # gRPC
    "--allow-grpc": _IMPLEMENTED,
    "--grpc-address": _IMPLEMENTED,
    "--grpc-port": _IMPLEMENTED,
    "--reuse-grpc-port": _ignored(
        "bool", "the gRPC port is never shared with another server (a second one fails to bind)"
    ),
    "--grpc-header-forward-pattern": _refused(
        "str", "forwarding gRPC headers as request parameters is not implemented"
    ),
    "--grpc-infer-allocation-pool-size": _ignored(
        "int", "there is no pool of request and response objects to size"
    ),
    "--grpc-use-ssl": _IMPLEMENTED,
    "--grpc-use-ssl-mutual": _IMPLEMENTED,
    "--grpc-server-cert": _IMPLEMENTED,
    "--grpc-server-key": _IMPLEMENTED,
    "--grpc-root-cert": _IMPLEMENTED,
    "--grpc-infer-response-compression-level": _IMPLEMENTED,
    "--grpc-keepalive-time": _IMPLEMENTED,
    "--grpc-keepalive-timeout": _IMPLEMENTED,
    "--grpc-keepalive-permit-without-calls": _IMPLEMENTED,
    "--grpc-http2-max-pings-without-data": _IMPLEMENTED,
    "--grpc-http2-min-recv-ping-interval-without-data": _IMPLEMENTED,
    "--grpc-http2-max-ping-strikes": _IMPLEMENTED,
    "--grpc-max-connection-age": _IMPLEMENTED,
    "--grpc-max-connection-age-grace": _IMPLEMENTED,
    "--grpc-restricted-protocol": _IMPLEMENTED,
    # SageMaker, Vertex AI
    "--allow-sagemaker": _refused("bool", "the SageMaker endpoint is not implemented", "false"),
    "--sagemaker-port": _ignored("int", _SAGEMAKER_OFF),
    "--sagemaker-safe-port-range": _ignored("str", _SAGEMAKER_OFF),
    "--sagemaker-thread-count": _ignored("int", _SAGEMAKER_OFF),
    "--allow-vertex-ai": _refused("bool", "the Vertex AI endpoint is not implemented", "false"),
    "--vertex-ai-port": _ignored("int", _VERTEX_OFF),
    "--vertex-ai-thread-count": _ignored("int", _VERTEX_OFF),
    "--vertex-ai-default-model": _ignored("str", _VERTEX_OFF),
    # Metrics
    "--allow-metrics": _IMPLEMENTED,
    "--allow-gpu-metrics": _IMPLEMENTED,
    "--allow-cpu-metrics": _IMPLEMENTED,
    "--metrics-address": _IMPLEMENTED,
    "--metrics-port": _IMPLEMENTED,
    "--metrics-interval-ms": _IMPLEMENTED,
    "--metrics-config": _IMPLEMENTED,
    # Tracing (the trace-* options are deprecated forms of --trace-config)
    "--trace-config": _IMPLEMENTED,
    "--trace-file": _IMPLEMENTED,
    "--trace-level": _IMPLEMENTED,
    "--trace-rate": _IMPLEMENTED,
    "--trace-count": _IMPLEMENTED,
    "--trace-log-frequency": _IMPLEMENTED,
    # Backends, repository agents, cache
    "--backend-directory": _ignored(
        "str", "backends are Python packages inside tensorgate, not shared libraries"
    ),
    "--backend-config": _IMPLEMENTED,
    "--repoagent-directory": _ignored("str", "no repository agent libraries are loaded"),
    "--cache-config": _IMPLEMENTED,
    "--cache-directory": _ignored("str", "no cache libraries are loaded"),
    "--response-cache-byte-size": _IMPLEMENTED,  # deprecated: --cache-config local,size=N
    # Rate limiter
    "--rate-limit": _refused("str", _NO_RATE_LIMIT, "off"),
    "--rate-limit-resource": _refused("str", _NO_RATE_LIMIT),
    # Memory and devices
    "--pinned-memory-pool-byte-size": _IMPLEMENTED,
    "--cuda-memory-pool-byte-size": _IMPLEMENTED,
    "--cuda-virtual-address-size": _ignored(
        "str", "it sizes growable implicit state of sequence models, which are not served"
    ),
    "--min-supported-compute-capability": _ignored(
        "float", "every GPU that CuPy and ONNX Runtime can run on is used"
    ),
    "--buffer-manager-thread-count": _ignored(
        "int", "tensor copies run on the model instances' own threads"
    ),
    "--host-policy": _refused(
        "str", "host policies (NUMA node, CPU cores per policy) are not implemented"
    ),
    "--model-load-gpu-limit": _refused(
        "str", "refusing loads past a fraction of GPU memory is not implemented"
    ),
}

#: Repository paths tritonserver reads from cloud storage.
CLOUD_PREFIXES = ("s3://", "gs://", "as://")


def not_implemented() -> dict[str, Compat]:
    """The options ``server.cli`` takes only to warn about or refuse."""
    return {n: c for n, c in TRITON_FLAGS.items() if c.support is not Support.IMPLEMENTED}


def help_text(compat: Compat) -> str:
    """``--help``'s line for an option that is not implemented."""
    if compat.support is Support.IGNORED:
        return f"No effect in tensorgate, accepted with a warning: {compat.why}"
    allowed = ", ".join(compat.harmless)
    tail = f"; {allowed} is accepted with a warning" if allowed else ""
    return f"Refused at start: {compat.why}{tail}"


class Refusal(Exception):
    """An option whose value asks for what tensorgate does not do."""


def check(name: str, values: Sequence[object]) -> str:
    """The warning for option ``name`` given ``values`` (each parsed); raises ``Refusal``
    with the line to print when one of them asks for something not implemented."""
    compat = TRITON_FLAGS[name]
    shown = [_shown(v) for v in values]
    if compat.support is Support.REFUSED:
        for value, text in zip(values, shown, strict=True):
            if compat.normalize(value) not in compat.harmless:
                raise Refusal(f"{name}={text} is not supported by tensorgate: {compat.why}")
    given = f"{name}={shown[0]}" if len(set(shown)) == 1 else name
    return f"{given} has no effect in tensorgate (ignored): {compat.why}"


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
