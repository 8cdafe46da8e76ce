"""What a pool gets where its spec says nothing and the operator's admin said something: one place, read by
the server reconciler (the servers' flags) and the model reconciler (what it renders).

``spec.allowedBackends`` unset means the operator's ``--default-allowed-backends`` (the chart's
``operator.defaultAllowedBackends``, by default the backends whose models are data, not code): a pool runs
Python, TorchScript or SavedModel models -- code with the pod's network and files -- only when its owners
list those backends themselves. Without the flag, unset means every backend (the standalone default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubeinfer.server.config.platforms import BUILTIN_BACKENDS

from .server_types import InferenceServerSpec

#: backends whose models run code of the model's author in the server (files, network, the pod's secrets)
CODE_BACKENDS = ("python", "pytorch", "tensorflow")


def parse_backends(value: str) -> tuple[str, ...]:
    """``--default-allowed-backends onnxruntime,tensorrt`` (names of built-in backends; empty: none)."""
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in BUILTIN_BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {', '.join(unknown)}: choose from {', '.join(BUILTIN_BACKENDS)}")
    return names


def pool_spec(spec: Mapping[str, Any], default_allowed_backends: Sequence[str] | None) -> Mapping[str, Any]:
    """``spec`` with the operator's defaults filled in where it says nothing."""
    if default_allowed_backends is None or spec.get("allowedBackends") is not None:
        return spec
    return {**spec, "allowedBackends": list(default_allowed_backends)}


def allowed_backends(spec: InferenceServerSpec, default_allowed_backends: Sequence[str] | None) -> Sequence[str] | None:
    """The backends the pool allows: its ``spec.allowedBackends``, else the operator's default (None: every one)."""
    return spec.allowed_backends if spec.allowed_backends is not None else default_allowed_backends


def pool_body(body: Mapping[str, Any], default_allowed_backends: Sequence[str] | None) -> Mapping[str, Any]:
    spec = pool_spec(body["spec"], default_allowed_backends)
    return body if spec is body["spec"] else {**body, "spec": spec}
