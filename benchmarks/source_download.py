"""The shared downloader (``kubeinfer.server.sources``) against the stores' own clients, one object, one run.

A real local S3 store (SeaweedFS) and a real registry (CNCF distribution) hold one object of ``--size-mib``
(default 1 GiB, random bytes). Each round fetches it in a fresh process, so each process's peak RSS is its
own, alternating:

* **s3**: the operator's path (``S3Source`` through the guarded client: one ranged GET, split into parallel
  ranged parts only when that stream is slow, see ``transfer``; sha256 while streaming and checked against the
  spec's sha256: a multipart upload's checksum is a checksum of parts)
  against boto3's ``download_file`` (s3transfer, its default concurrency of 10 and 8 MiB parts; no digest), and
  against that followed by the file's sha256 (what the operator must know before it publishes a version);
* **oci**: the operator's path (``OciSource``, the layer checked against its digest) against ``oras pull``
  (the ORAS CLI, which checks digests too; one sequential GET per blob). ``oras``'s seconds are its whole
  process (start, manifest, blob, exit); ours are the download from the manifest request on (``seconds``: the
  operator's process is long-lived) and, like with like, the whole child process (``process_seconds``,
  interpreter start and imports included); both ratios are written.

``--before REV`` also measures the downloader as it was at git revision ``REV`` (its ``server/sources``,
extracted with ``git archive``), alternating in the same rounds: a before/after from one run on one load.

Printed and written: medians of ``--rounds`` of throughput (MiB/s), the ratio ours/theirs, and each
process's RSS growth during the download (peak minus before; for ``oras``, its peak RSS). Results:
``benchmarks/results/source-download-<time>.json``. A measurement, never a test: the machine is shared.

    .venv/bin/python benchmarks/source_download.py --size-mib 1024 --rounds 3 [--before HEAD]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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
    import importlib
    if job.get("before"):  # an earlier revision's server/sources, extracted as the package before_sources
        sys.path.insert(0, job["before"])
    package = "before_sources" if job.get("before") else "kubeinfer.server.sources"
    def module(name):
        return importlib.import_module(f"{package}.{name}")
    egress, transfer, uris = module("egress"), module("transfer"), module("uris")
    client = module("client").StoreClient(egress.AddressPolicy(allowed=egress.parse_networks(["127.0.0.0/8"])))
    if job["kind"] == "ours-s3":
        from botocore.credentials import Credentials
        s3 = module("s3")
        location = uris.parse_s3(f"s3://{job['bucket']}/{job['object']}")
        source = s3.S3Source(client, location, s3.S3Endpoint.of(location, job["endpoint"], None, None),
                             Credentials(job["key"], job["secret"]), "")
        before, started = start()
        (file,) = source.files(job["sha256"], 10, 1 << 40)
    else:
        source = module("oci").OciSource(client, uris.parse_oci(job["uri"]), "", plain_http=True)
        before, started = start()
        (file,) = source.files(10, 1 << 40)
    fd = os.open(job["out"], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    limits = transfer.Limits(max_bytes=1 << 40, deadline_at=time.monotonic() + 3600)
    transfer.download(source, file, fd, limits, "bench")
    os.close(fd)
seconds = time.monotonic() - started
print(json.dumps({"seconds": seconds, "rss_growth_mib": (kib("VmHWM") - before) / 1024}))
"""


def child(job: dict[str, Any]) -> dict[str, Any]:
    """``seconds``: the download as the operator does it (its process is long-lived: from the request for the
    listing or manifest to the last byte checked); ``process_seconds``: the whole child, interpreter start and
    imports included, as ``oras pull``'s own figure counts its process."""
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1])) | {"process_seconds": time.monotonic() - started}


def peak_rss_mib(pid: int, done: threading.Event, into: list[float]) -> None:
    """The process's VmHWM, polled until it exits. Not ``ru_maxrss``: a child started by vfork inherits the
    benchmark's own high-water mark (over 1 GiB once the object was read) through its exec."""
    while not done.is_set():
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    into.append(int(line.split()[1]) / 1024)
        done.wait(0.02)


def extract_before(rev: str, into: Path) -> Path:
    """``server/sources`` at ``rev`` as the package ``before_sources`` under ``into`` (its imports are relative)."""
    archive = subprocess.run(["git", "archive", rev, "server/sources"], cwd=ROOT, capture_output=True, check=True)
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    (into / "server" / "sources").rename(into / "before_sources")
    return into


def oras_pull(registry: Any, ref: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(registry.bin_dir / "oras"), "pull", "--plain-http", "-o", str(out_dir), ref],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    done, peaks = threading.Event(), [0.0]
    watcher = threading.Thread(target=peak_rss_mib, args=(proc.pid, done, peaks))
    watcher.start()
    _, status, _ = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    done.set()
    watcher.join()
    if status != 0:
        raise RuntimeError(f"oras pull failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return {"seconds": seconds, "rss_peak_mib": max(peaks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-oci", action="store_true")
    parser.add_argument("--before", metavar="REV", help="also measure server/sources as at this git revision")
    args = parser.parse_args()
    from tests.support.oci_registry import OciRegistry
    from tests.support.s3_store import S3Store

    report: dict[str, Any] = results_file.header() | {"size_mib": args.size_mib, "rounds": args.rounds}
    if args.before:
        report["before"] = subprocess.run(
            ["git", "rev-parse", args.before], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="source-bench-") as tmp:
        work = Path(tmp)
        before_dir = ""
        if args.before:
            before_dir = str(extract_before(args.before, work / "before"))
        blob = work / "model.bin"
        with blob.open("wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(1 << 20))
        with blob.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        runs: dict[str, list[dict[str, Any]]] = {"ours-s3": [], "boto3": [], "boto3+sha256": []}
        runs |= {"before-s3": []} if args.before else {}
        runs |= {"ours-oci": [], "oras": []} | ({"before-oci": []} if args.before else {})
        s3_kinds = ("ours-s3", "boto3", "boto3+sha256") + (("before-s3",) if args.before else ())
        with S3Store(work / "s3") as store:
            s3 = store.client()
            s3.create_bucket(Bucket="bench")
            s3.upload_file(str(blob), "bench", "model.bin")  # multipart: pinned by the spec's sha256, as a user would
            key, secret = store.credentials("reader")
            base = {"endpoint": store.endpoint, "key": key, "secret": secret, "bucket": "bench", "object": "model.bin"}
            base["sha256"] = digest
            for _ in range(args.rounds):
                for kind in s3_kinds:
                    out = work / f"out-{kind}"
                    job = {**base, "kind": kind.split("+")[0], "out": str(out), "verify": kind.endswith("sha256")}
                    if kind == "before-s3":
                        job |= {"kind": "ours-s3", "before": before_dir}
                    result = child(job)
                    with out.open("rb") as f:
                        assert hashlib.file_digest(f, "sha256").hexdigest() == digest, kind
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
                    if args.before:
                        earlier = child({"kind": "ours-oci", "uri": uri, "out": str(out), "before": before_dir})
                        out.unlink()
                        runs["before-oci"].append(earlier)
                        print("before-oci", json.dumps(earlier), flush=True)
    medians: dict[str, Any] = {}
    for kind, values in runs.items():
        if values:
            seconds = statistics.median(v["seconds"] for v in values)
            medians[kind] = {"seconds": round(seconds, 3), "mib_per_s": round(args.size_mib / seconds, 1)}
            if "rss_growth_mib" in values[0]:
                medians[kind]["rss_growth_mib"] = round(statistics.median(v["rss_growth_mib"] for v in values), 1)
            if "process_seconds" in values[0]:
                medians[kind]["process_seconds"] = round(statistics.median(v["process_seconds"] for v in values), 3)
            if "rss_peak_mib" in values[0]:
                medians[kind]["rss_peak_mib"] = round(statistics.median(v["rss_peak_mib"] for v in values), 1)
    ratios = {
        "s3_ours_over_boto3": round(medians["boto3"]["seconds"] / medians["ours-s3"]["seconds"], 3),
        "s3_ours_over_boto3_then_sha256": round(medians["boto3+sha256"]["seconds"] / medians["ours-s3"]["seconds"], 3),
    }
    if "oras" in medians:
        ratios["oci_ours_over_oras"] = round(medians["oras"]["seconds"] / medians["ours-oci"]["seconds"], 3)
        ratios["oci_ours_process_over_oras"] = round(
            medians["oras"]["seconds"] / medians["ours-oci"]["process_seconds"], 3
        )
    for kind in ("s3", "oci"):
        if f"before-{kind}" in medians and f"ours-{kind}" in medians:
            ratios[f"{kind}_ours_over_before"] = round(
                medians[f"before-{kind}"]["seconds"] / medians[f"ours-{kind}"]["seconds"], 3
            )
        if kind == "s3" and "before-s3" in medians:
            ratios["s3_before_over_boto3"] = round(medians["boto3"]["seconds"] / medians["before-s3"]["seconds"], 3)
        if kind == "oci" and "before-oci" in medians and "oras" in medians:
            ratios["oci_before_over_oras"] = round(medians["oras"]["seconds"] / medians["before-oci"]["seconds"], 3)
    report |= {"runs": runs, "medians": medians, "throughput_ratios": ratios}
    path = results_file.write(report, "source-download")
    print(json.dumps({"medians": medians, "throughput_ratios": ratios}, indent=1))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
