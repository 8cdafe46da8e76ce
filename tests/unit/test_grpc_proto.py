"""Our grpc_service.proto is wire-identical to the protocol: checked against tritonclient's descriptors.

Message and field names, numbers, types, labels and oneofs must match for every message we declare
(nested ones included), and every RPC we serve must exist with the same types. Only package names
differ (``kubeinfer.inference`` vs ``inference``), and those never travel on the wire.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf.descriptor import Descriptor
from kubeinfer.server.grpc import grpc_service_pb2 as ours
from kubeinfer.server.grpc.server import SERVICE_NAME
from kubeinfer.server.grpc.servicer import UNIMPLEMENTED
from tritonclient.grpc import service_pb2 as theirs

ROOT = Path(__file__).resolve().parents[2]


def _local(full_name: str) -> str:
    for prefix in ("kubeinfer.inference.", "inference."):
        if full_name.startswith(prefix):
            return full_name[len(prefix) :]
    return full_name


def _signature(d: Descriptor) -> dict[str, tuple]:
    return {
        f.name: (
            f.number,
            f.type,
            f.is_repeated,
            f.is_required,
            _local(f.message_type.full_name) if f.message_type else None,
            _local(f.enum_type.full_name) if f.enum_type else None,
            f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in d.fields
    }


def test_every_message_matches_the_protocol() -> None:
    checked = 0
    stack = [
        (d, theirs.DESCRIPTOR.message_types_by_name.get(name))
        for name, d in ours.DESCRIPTOR.message_types_by_name.items()
    ]
    while stack:
        mine, reference = stack.pop()
        assert reference is not None, f"{mine.full_name} is not a message of the protocol"
        assert _signature(mine) == _signature(reference), mine.full_name
        stack += [(n, reference.nested_types_by_name.get(n.name)) for n in mine.nested_types]
        checked += 1
    assert checked >= 40


def test_every_rpc_matches_the_protocol() -> None:
    mine = ours.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    reference = theirs.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert reference.full_name == SERVICE_NAME  # the name our handlers are registered under
    for method in mine.methods:
        ref = reference.methods_by_name[method.name]
        assert (method.input_type.name, method.output_type.name) == (ref.input_type.name, ref.output_type.name)
        assert (method.client_streaming, method.server_streaming) == (ref.client_streaming, ref.server_streaming)
    # the rest answer UNIMPLEMENTED with a message rather than gRPC's bare "method not found"
    assert {m.name for m in reference.methods} == {m.name for m in mine.methods} | set(UNIMPLEMENTED)


def test_config_message_is_ours() -> None:
    field = ours.ModelConfigResponse.DESCRIPTOR.fields_by_name["config"]
    assert field.message_type.full_name == "kubeinfer.inference.ModelConfig"


def test_generated_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
