"""The server's side of a measurement: model metadata/config, the statistics API, and its CPU time.

Everything here talks to the server over the same protocol as the load (HTTP JSON or gRPC), so a
server with one of the two listeners only can still be measured. A server without the statistics
or config API (MLServer) is measured all the same: the server-side split is then left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .model import PerfError

STAT_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


class ServerApi:
    def __init__(
        self,
        protocol: str,
        url: str,
        headers: list[tuple[str, str]],
        tls: tuple[bytes | None, bytes | None, bytes | None] | None = None,
    ) -> None:
        self.protocol = protocol
        self.url = url
        self.headers = headers
        self._http: httpx.Client | None = None
        self._channel: Any = None
        if protocol == "http":
            self._http = httpx.Client(base_url=f"http://{url}", headers=headers, timeout=30)
        else:
            import grpc

            if tls is not None:
                self._channel = grpc.secure_channel(url, grpc.ssl_channel_credentials(*tls))
            else:
                self._channel = grpc.insecure_channel(url)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._channel is not None:
            self._channel.close()

    def _path(self, model: str, version: str, suffix: str = "") -> str:
        return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + suffix

    def _rpc(self, method: str, request: Any, response_cls: Any) -> Any:
        call = self._channel.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        return call(request, metadata=self.headers or None, timeout=30)

    def _grpc_dict(self, method: str, request: Any, response_cls: Any) -> dict[str, Any]:
        from google.protobuf import json_format

        return json_format.MessageToDict(
            self._rpc(method, request, response_cls),
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )

    def metadata(self, model: str, version: str) -> dict[str, Any]:
        if self._http is not None:
            try:
                answer = self._http.get(self._path(model, version))
            except httpx.HTTPError as exc:
                raise PerfError(f"cannot reach the server at {self.url}: {exc}") from None
            if answer.status_code != 200:
                raise PerfError(f"model metadata of '{model}': HTTP {answer.status_code} {answer.text[:300]}")
            return dict(answer.json())
        import grpc

        from ...grpc import grpc_service_pb2 as pb

        try:
            return self._grpc_dict(
                "ModelMetadata", pb.ModelMetadataRequest(name=model, version=version), pb.ModelMetadataResponse
            )
        except grpc.RpcError as exc:
            raise PerfError(f"model metadata of '{model}': {exc.code().name} {exc.details()}") from None

    def config(self, model: str, version: str) -> dict[str, Any] | None:
        """The model configuration, or None when the server has no config API."""
        if self._http is not None:
            answer = self._http.get(self._path(model, version, "/config"))
            return dict(answer.json()) if answer.status_code == 200 else None
        import grpc

        from ...grpc import grpc_service_pb2 as pb

        try:
            config: dict[str, Any] = self._grpc_dict(
                "ModelConfig", pb.ModelConfigRequest(name=model, version=version), pb.ModelConfigResponse
            )["config"]
            return config
        except grpc.RpcError:
            return None

    def statistics(self, model: str, version: str) -> dict[str, Any] | None:
        """This model version's statistics (summed over versions when none is named), or None."""
        try:
            if self._http is not None:
                answer = self._http.get(self._path(model, version, "/stats"))
                if answer.status_code != 200:
                    return None
                stats = answer.json().get("model_stats") or []
            else:
                from ...grpc import grpc_service_pb2 as pb

                stats = self._grpc_dict(
                    "ModelStatistics",
                    pb.ModelStatisticsRequest(name=model, version=version),
                    pb.ModelStatisticsResponse,
                ).get("model_stats", [])
        except Exception:  # a server without statistics is measured all the same
            return None
        return _sum_stats(stats) if stats else None


def _sum_stats(stats: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {"execution_count": 0, "inference_count": 0, "success_count": 0, "fail_count": 0}
    for part in STAT_PARTS:
        out[f"{part}_ns"] = out[f"{part}_count"] = 0
    for entry in stats:
        out["execution_count"] += int(entry.get("execution_count", 0))
        out["inference_count"] += int(entry.get("inference_count", 0))
        inference = entry.get("inference_stats") or {}
        out["success_count"] += int((inference.get("success") or {}).get("count", 0))
        out["fail_count"] += int((inference.get("fail") or {}).get("count", 0))
        for part in STAT_PARTS:
            item = inference.get(part) or {}
            out[f"{part}_ns"] += int(item.get("ns", 0))
            out[f"{part}_count"] += int(item.get("count", 0))
    return out


def server_split(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, Any] | None:
    """Average server-side microseconds per request in each phase between two statistics snapshots."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in after}
    split: dict[str, Any] = {"success": delta["success_count"], "fail": delta["fail_count"]}
    for part in STAT_PARTS:
        count = delta[f"{part}_count"]
        split[f"{part}_us"] = round(delta[f"{part}_ns"] / count / 1000, 1) if count else None
    executions = delta["execution_count"]
    split["executions"] = executions
    split["avg_batch"] = round(delta["inference_count"] / executions, 2) if executions else None
    return split


# ---- CPU of a local server (--server-pid) -------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every live descendant (Triton's Python stubs, MLServer's
    workers). Linux only; 0 for processes that are gone."""
    total = 0.0
    stack = [pid]
    seen = set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
        stack += _children(p)
    return total


@dataclass
class CpuProbe:
    pid: int

    def read(self) -> float:
        return process_tree_cpu(self.pid)
