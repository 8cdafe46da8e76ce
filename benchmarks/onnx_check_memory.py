"""Memory and time of the operator's ONNX check on a big model: the streaming read against ``onnx.load``.

Each variant runs in a fresh Python process that imports everything first, then reads its own peak
resident set (``VmHWM`` in /proc/self/status) before and after the work:

* ``stream``: ``check_onnx`` (operator/sources/onnx_check.py; the read is server/config/onnx_signature.py), what the
  operator runs;
* ``onnx.load``: the whole-file load the operator used before (``load_external_data=False``);
* ``writer``: the operator's whole render of a ``source.path`` model of that size (RepositoryWriter:
  copy into staging, fsync, check, publish), i.e. the operator's own process during a check.

The model is an ONNX file whose weight is a hole (tests/support/onnx_files.py): valid, ``size`` bytes
long, no disk used for the weight (the ``writer`` variant writes a real copy, deleted afterwards).
Results go to ``benchmarks/results/onnx-check-memory-<time>.json``. A measurement, never a test.

    .venv/bin/python benchmarks/onnx_check_memory.py --size-gib 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import results_file  # noqa: E402
from tests.support.onnx_files import write_big_model  # noqa: E402

CHILD = r"""
import json, sys, time
from pathlib import Path

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM", "VmRSS")):
            yield line.split(":")[0], int(line.split()[1]) * 1024

import onnx
from kubeinfer.operator.sources.onnx_check import check_onnx
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.volume.repository_writer import RepositoryWriter

variant, path = sys.argv[1], Path(sys.argv[2])
spec = {"server": "s", "platform": "onnxruntime_onnx", "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versions": [{"version": 1, "source": {"path": "uploads/" + path.name}}]}
rendered = render_model("m", spec)
before = dict(hwm())
started = time.monotonic()
if variant == "stream":
    problems = check_onnx(path, rendered.config, 1)
elif variant == "onnx.load":
    model = onnx.load(str(path), load_external_data=False)
    problems = [i.name for i in model.graph.input]
else:
    root = path.parent.parent.parent
    writer = RepositoryWriter(root)
    problems = writer.sync_model(writer.server_dir("ns", "ns/pool"), rendered).added_versions
seconds = time.monotonic() - started
after = dict(hwm())
print(json.dumps({"result": repr(problems), "seconds": seconds, "peak_rss_before": before["VmHWM"],
                  "peak_rss_after": after["VmHWM"], "peak_rss_growth": after["VmHWM"] - before["VmHWM"]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--variants", default="stream,onnx.load,writer")
    args = parser.parse_args()
    size = int(args.size_gib * (1 << 30)) // 4 * 4
    report = {**results_file.header(), "model_bytes": size, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        uploads = Path(tmp) / "root" / "ns" / "uploads"
        uploads.mkdir(parents=True)
        path = uploads / "big.onnx"
        report["file_bytes"] = write_big_model(path, size)
        for variant in args.variants.split(","):
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, variant, str(path)], capture_output=True, text=True, cwd=ROOT
            )
            if proc.returncode != 0:
                report["variants"][variant] = {"error": proc.stderr[-2000:]}
            else:
                report["variants"][variant] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(variant, json.dumps(report["variants"][variant]), flush=True)
    print(results_file.write(report, "onnx-check-memory"))


if __name__ == "__main__":
    main()
