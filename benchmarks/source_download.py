"""The shared downloader (``kubeinfer.server.sources``) against the stores' own clients, one object, one run.

A real local S3 store (SeaweedFS) and a real registry (CNCF distribution) hold one object of ``--size-mib``
(default 1 GiB, random bytes). Each round fetches it in a fresh process, so each process's peak RSS is its
own, alternating:

* **s3**: the operator's path (``S3Source`` through the guarded client, parallel ranged GETs, sha256 while
  streaming and checked against the spec's sha256: a multipart upload's checksum is a checksum of parts)
  against boto3's ``download_file`` (s3transfer, its default concurrency of 10 and 8 MiB parts; no digest), and
  against that followed by the file's sha256 (what the operator must know before it publishes a version);
* **oci**: the operator's path (``OciSource``, the layer checked against its digest) against ``oras pull``
  (the ORAS CLI, which checks digests too).

Printed and written: medians of ``--rounds`` of throughput (MiB/s), the ratio ours/theirs, and each
process's RSS growth during the download (peak minus before). Results:
``benchmarks/results/source-download-<time>.json``. A measurement, never a test: the machine is shared.

    .venv/bin/python benchmarks/source_download.py --size-mib 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_file  # noqa: E402

CHILD = r"""
import json, os, sys, time
from pathlib import Path
def kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0
def start():
    # the peak so far (imports: botocore's data files) is not the download's: reset the high-water mark
    Path("/proc/self/clear_refs").write_text("5")
    return kib("VmRSS"), time.monotonic()
job = json.loads(sys.argv[1])
if job["kind"] == "boto3":
    import boto3
    s3 = boto3.client("s3", endpoint_url=job["endpoint"], region_name="us-east-1",
                      aws_access_key_id=job["key"], aws_secret_access_key=job["secret"])
    before, started = start()
    s3.download_file(job["bucket"], job["object"], job["out"])
    if job.get("verify"):  # what the operator does on top: the file's sha256 against the pin
        import hashlib
        digest = hashlib.sha256()
        with open(job["out"], "rb") as f:
            while block := f.read(4 << 20):
                digest.update(block)
        assert digest.hexdigest() == job["sha256"]
else:
    from kubeinfer.server.sources.client import StoreClient
    from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
    from kubeinfer.server.sources.transfer import Limits, download
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.0/8"])))
    if job["kind"] == "ours-s3":
        from botocore.credentials import Credentials
        from kubeinfer.server.sources.s3 import S3Endpoint, S3Source
        from kubeinfer.server.sources.uris import parse_s3
        location = parse_s3(f"s3://{job['bucket']}/{job['object']}")
        source = S3Source(client, location, S3Endpoint.of(location, job["endpoint"], None, None),
                          Credentials(job["key"], job["secret"]), "")
        before, started = start()
        (file,) = source.files(job["sha256"], 10, 1 << 40)
    else:
        from kubeinfer.server.sources.oci import OciSource
        from kubeinfer.server.sources.uris import parse_oci
        source = OciSource(client, parse_oci(job["uri"]), "", plain_http=True)
        before, started = start()
        (file,) = source.files(10, 1 << 40)
    fd = os.open(job["out"], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    download(source, file, fd, Limits(max_bytes=1 << 40, deadline_at=time.monotonic() + 3600), "bench")
    os.close(fd)
seconds = time.monotonic() - started
print(json.dumps({"seconds": seconds, "rss_growth_mib": (kib("VmHWM") - before) / 1024}))
"""


def child(job: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def oras_pull(registry: Any, ref: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(registry.bin_dir / "oras"), "pull", "--plain-http", "-o", str(out_dir), ref],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"oras pull failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return {"seconds": time.monotonic() - started, "rss_peak_mib": usage.ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-oci", action="store_true")
    args = parser.parse_args()
    from tests.support.oci_registry import OciRegistry
    from tests.support.s3_store import S3Store

    report: dict[str, Any] = results_file.header() | {"size_mib": args.size_mib, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="source-bench-") as tmp:
        work = Path(tmp)
        blob = work / "model.bin"
        with blob.open("wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(1 << 20))
        digest = hashlib.sha256(blob.read_bytes()).hexdigest()
        runs: dict[str, list[dict[str, Any]]] = {
            "ours-s3": [],
            "boto3": [],
            "boto3+sha256": [],
            "ours-oci": [],
            "oras": [],
        }
        with S3Store(work / "s3") as store:
            s3 = store.client()
            s3.create_bucket(Bucket="bench")
            s3.upload_file(str(blob), "bench", "model.bin")  # multipart: pinned by the spec's sha256, as a user would
            key, secret = store.credentials("reader")
            base = {"endpoint": store.endpoint, "key": key, "secret": secret, "bucket": "bench", "object": "model.bin"}
            base["sha256"] = digest
            for _ in range(args.rounds):
                for kind in ("ours-s3", "boto3", "boto3+sha256"):
                    out = work / f"out-{kind}"
                    job = {**base, "kind": kind.split("+")[0], "out": str(out), "verify": kind.endswith("sha256")}
                    result = child(job)
                    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest, kind
                    out.unlink()
                    runs[kind].append(result)
                    print(kind, json.dumps(result), flush=True)
        if not args.skip_oci:
            with OciRegistry(work / "registry", anonymous_read=True) as registry:
                registry.push_artifact("bench/model", "v1", {"model.bin": blob})
                uri = f"oci://{registry.address}/bench/model:v1"
                for i in range(args.rounds):
                    out = work / "out-ours-oci"
                    result = child({"kind": "ours-oci", "uri": uri, "out": str(out)})
                    out.unlink()
                    runs["ours-oci"].append(result)
                    pulled = work / f"pulled-{i}"
                    theirs = oras_pull(registry, registry.ref("bench/model", "v1"), pulled)
                    runs["oras"].append(theirs)
                    subprocess.run(["rm", "-rf", str(pulled)], check=True)
                    print("ours-oci", json.dumps(result), "oras", json.dumps(theirs), flush=True)
    medians: dict[str, Any] = {}
    for kind, values in runs.items():
        if values:
            seconds = statistics.median(v["seconds"] for v in values)
            medians[kind] = {"seconds": round(seconds, 3), "mib_per_s": round(args.size_mib / seconds, 1)}
            if "rss_growth_mib" in values[0]:
                medians[kind]["rss_growth_mib"] = round(statistics.median(v["rss_growth_mib"] for v in values), 1)
            if "rss_peak_mib" in values[0]:
                medians[kind]["rss_peak_mib"] = round(statistics.median(v["rss_peak_mib"] for v in values), 1)
    ratios = {
        "s3_ours_over_boto3": round(medians["boto3"]["seconds"] / medians["ours-s3"]["seconds"], 3),
        "s3_ours_over_boto3_then_sha256": round(medians["boto3+sha256"]["seconds"] / medians["ours-s3"]["seconds"], 3),
    }
    if "oras" in medians:
        ratios["oci_ours_over_oras"] = round(medians["oras"]["seconds"] / medians["ours-oci"]["seconds"], 3)
    report |= {"runs": runs, "medians": medians, "throughput_ratios": ratios}
    path = results_file.write(report, "source-download")
    print(json.dumps({"medians": medians, "throughput_ratios": ratios}, indent=1))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
