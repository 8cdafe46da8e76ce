"""A lean closed-loop load generator for KServe v2 servers: HTTP (binary tensors) and gRPC.

The client shares the machine's cores with the server, so it does as little as possible per request:
the request is encoded once (raw HTTP/1.1 bytes over keep-alive sockets, or one protobuf message) and
every connection sends it again as soon as its previous answer arrived (closed loop, ``concurrency``
requests in flight). Responses are checked for status only.

With ``--shared-memory`` every connection gets its own input and output regions (created with
tritonclient's ``tritonclient.utils.shared_memory`` helpers and registered over the same protocol);
requests then carry only the JSON/protobuf header and the server reads and writes the tensors in place.
Outputs need their full spec (``NAME:DATATYPE:DIMS``) in that mode, so that their regions can be sized.

Run on its own (prints one JSON line):

    .venv/bin/python benchmarks/loadgen.py --protocol http --url 127.0.0.1:8000 --model cifar10_resnet \
        --input input:FP32:3x32x32 --concurrency 16 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8}


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]  # including the batch dimension

    @classmethod
    def parse(cls, spec: str, batch: int = 1) -> Tensor:
        name, datatype, dims = spec.split(":")
        return cls(name, datatype, [batch, *(int(d) for d in dims.split("x"))])

    def data(self, rng: np.random.Generator) -> bytes:
        return rng.standard_normal(self.shape).astype(DTYPES[self.datatype]).tobytes()


def nbytes(t: Tensor) -> int:
    return int(np.prod(t.shape)) * np.dtype(DTYPES[t.datatype]).itemsize


def output_name(spec: str) -> str:
    return spec.split(":", 1)[0]


def http_request(
    host: str,
    model: str,
    tensors: list[Tensor],
    outputs: list[str],
    rng: np.random.Generator,
    regions: dict[str, str] | None = None,
) -> bytes:
    """The request bytes; with ``regions`` (tensor name → region) tensors travel in shared memory."""
    payloads = [] if regions else [t.data(rng) for t in tensors]
    if regions:
        header: dict[str, Any] = {
            "inputs": [
                {"name": t.name, "shape": t.shape, "datatype": t.datatype, "parameters": _shm_params(regions, t)}
                for t in tensors
            ],
            "outputs": [
                {"name": o.name, "parameters": _shm_params(regions, o)} for o in (Tensor.parse(s) for s in outputs)
            ],
        }
    else:
        header = {
            "inputs": [
                {"name": t.name, "shape": t.shape, "datatype": t.datatype, "parameters": {"binary_data_size": len(p)}}
                for t, p in zip(tensors, payloads, strict=True)
            ],
            "outputs": [{"name": output_name(n), "parameters": {"binary_data": True}} for n in outputs],
        }
    head = json.dumps(header, separators=(",", ":")).encode()
    body = head + b"".join(payloads)
    length = f"Inference-Header-Content-Length: {len(head)}\r\n" if payloads else ""
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"{length}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _shm_params(regions: dict[str, str], t: Tensor) -> dict[str, Any]:
    return {"shared_memory_region": regions[t.name], "shared_memory_byte_size": nbytes(t)}


class Regions:
    """One input and one output region per tensor for each connection (tritonclient's helpers)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.handles: list[Any] = []
        self.registered: list[tuple[str, str, int]] = []

    def make(
        self, worker: int, tensors: list[Tensor], outputs: list[Tensor], rng: np.random.Generator
    ) -> dict[str, str]:
        import tritonclient.utils.shared_memory as shm

        names: dict[str, str] = {}
        for t in [*tensors, *outputs]:
            name = f"{self.tag}_{worker}_{t.name}"
            handle = shm.create_shared_memory_region(name, f"/{name}", nbytes(t))
            if t in tensors:
                shm.set_shared_memory_region(handle, [rng.standard_normal(t.shape).astype(DTYPES[t.datatype])])
            self.handles.append(handle)
            self.registered.append((name, f"/{name}", nbytes(t)))
            names[t.name] = name
        return names

    def destroy(self) -> None:
        import tritonclient.utils.shared_memory as shm

        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


async def _http_worker(host: str, port: int, request: bytes, stop: float, lat: list[float], errors: list[str]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(head.split(b"\r\n", 1)[0].decode() + " " + body[:200].decode(errors="replace"))
                continue
            lat.append(time.perf_counter() - t0)
    finally:
        writer.close()


async def _grpc_worker(stub: Any, request: Any, stop: float, lat: list[float], errors: list[str]) -> None:
    import grpc

    while True:
        t0 = time.perf_counter()
        if t0 >= stop:
            return
        try:
            await stub.ModelInfer(request)
        except grpc.aio.AioRpcError as exc:
            errors.append(f"{exc.code().name}: {exc.details()}")
            continue
        lat.append(time.perf_counter() - t0)


async def run(
    protocol: str,
    url: str,
    model: str,
    tensors: list[Tensor],
    outputs: list[str],
    concurrency: int,
    seconds: float,
    warmup: float,
    shared_memory: bool = False,
) -> dict[str, Any]:
    host, port = url.rsplit(":", 1)
    rng = np.random.default_rng(0)
    channel = None
    regions = Regions(f"kubeinfer_loadgen_{os.getpid()}") if shared_memory else None
    per_worker: list[dict[str, str] | None] = [None] * concurrency
    if regions is not None:
        out_tensors = [Tensor.parse(s) for s in outputs]
        per_worker = [regions.make(w, tensors, out_tensors, rng) for w in range(concurrency)]
    if protocol == "http":
        if regions is not None:
            import httpx

            for name, key, size in regions.registered:
                r = httpx.post(
                    f"http://{url}/v2/systemsharedmemory/region/{name}/register",
                    json={"key": key, "offset": 0, "byte_size": size},
                )
                r.raise_for_status()
        requests = [http_request(url, model, tensors, outputs, rng, per_worker[w]) for w in range(concurrency)]
        workers = itertools.count()

        def worker(stop: float, lat: list[float], errors: list[str]) -> Any:
            return _http_worker(host, int(port), requests[next(workers) % concurrency], stop, lat, errors)
    else:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        channel = grpc.aio.insecure_channel(
            url, options=[("grpc.max_receive_message_length", 1 << 28), ("grpc.max_send_message_length", 1 << 28)]
        )
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        if regions is not None:
            for name, key, size in regions.registered:
                await stub.SystemSharedMemoryRegister(
                    service_pb2.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=size)
                )
        messages = [_grpc_message(service_pb2, model, tensors, outputs, rng, per_worker[w]) for w in range(concurrency)]
        grpc_workers = itertools.count()

        def worker(stop: float, lat: list[float], errors: list[str]) -> Any:
            return _grpc_worker(stub, messages[next(grpc_workers) % concurrency], stop, lat, errors)

    try:
        if warmup > 0:
            await asyncio.gather(*(worker(time.perf_counter() + warmup, [], []) for _ in range(concurrency)))
        latencies: list[float] = []
        errors: list[str] = []
        start = time.perf_counter()
        await asyncio.gather(*(worker(start + seconds, latencies, errors) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        if regions is not None:
            await _unregister(protocol, url, stub if channel is not None else None, regions)
            regions.destroy()
        if channel is not None:
            await channel.close()
    lat_ms = np.array(latencies) * 1000
    rows = tensors[0].shape[0]
    return {
        "protocol": protocol,
        "shared_memory": shared_memory,
        "model": model,
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "requests": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "throughput": round(len(latencies) * rows / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 2) if len(lat_ms) else None,
        "p90_ms": round(float(np.percentile(lat_ms, 90)), 2) if len(lat_ms) else None,
        "p99_ms": round(float(np.percentile(lat_ms, 99)), 2) if len(lat_ms) else None,
    }


def _grpc_message(
    service_pb2: Any,
    model: str,
    tensors: list[Tensor],
    outputs: list[str],
    rng: np.random.Generator,
    regions: dict[str, str] | None,
) -> Any:
    message = service_pb2.ModelInferRequest(model_name=model)
    for t in tensors:
        tensor = message.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        if regions:
            tensor.parameters["shared_memory_region"].string_param = regions[t.name]
            tensor.parameters["shared_memory_byte_size"].int64_param = nbytes(t)
        else:
            message.raw_input_contents.append(t.data(rng))
    for spec in outputs:
        out = message.outputs.add(name=output_name(spec))
        if regions:
            o = Tensor.parse(spec)
            out.parameters["shared_memory_region"].string_param = regions[o.name]
            out.parameters["shared_memory_byte_size"].int64_param = nbytes(o)
    return message


async def _unregister(protocol: str, url: str, stub: Any, regions: Regions) -> None:
    if protocol == "http":
        import httpx

        async with httpx.AsyncClient() as client:
            for name, _, _ in regions.registered:
                await client.post(f"http://{url}/v2/systemsharedmemory/region/{name}/unregister")
    else:
        from tritonclient.grpc import service_pb2

        for name, _, _ in regions.registered:
            await stub.SystemSharedMemoryUnregister(service_pb2.SystemSharedMemoryUnregisterRequest(name=name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--url", required=True, help="host:port")
    p.add_argument("--model", required=True)
    p.add_argument("--input", action="append", required=True, help="NAME:DATATYPE:DIMSxDIMS (no batch dim)")
    p.add_argument("--output", action="append", default=[], help="NAME (or NAME:DATATYPE:DIMS, needed with shm)")
    p.add_argument("--shared-memory", action="store_true", help="tensors in system shared memory regions")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    args = p.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    tensors = [Tensor.parse(s) for s in args.input]
    result = asyncio.run(
        run(
            args.protocol,
            args.url,
            args.model,
            tensors,
            args.output,
            args.concurrency,
            args.seconds,
            args.warmup,
            args.shared_memory,
        )
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
