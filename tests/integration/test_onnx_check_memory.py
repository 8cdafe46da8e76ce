"""The operator's ONNX check of a 1 GiB model keeps the process's memory flat (issue 23, part 5).

A fresh Python process imports the operator's check, reads its peak resident set (VmHWM), checks a
valid 1 GiB ONNX model (its weight a hole in a sparse file: no disk used) and reads the peak again.
``onnx.load`` of the same file, as the operator did before, grows it by ~2 GiB
(benchmarks/onnx_check_memory.py); the streaming read must stay within a few MiB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.onnx_files import write_big_model

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, time
from pathlib import Path
from kubeinfer.operator.sources.onnx_check import check_onnx
from kubeinfer.operator.models.render import render_model

def peak():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))

spec = {"server": "s", "platform": "onnxruntime_onnx", "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [DIMS]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [DIMS]}],
        "versions": [{"version": 1, "source": {"path": "m.onnx"}}]}
config = render_model("m", spec).config
before = peak()
started = time.monotonic()
problems = check_onnx(Path(sys.argv[1]), config, 1)
print(json.dumps({"problems": problems, "seconds": time.monotonic() - started, "growth": peak() - before}))
"""


def _check(path: Path, dims: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.replace("DIMS", str(dims)), str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_checking_a_1_gib_model_keeps_memory_flat(tmp_path: Path) -> None:
    path = tmp_path / "big.onnx"
    assert write_big_model(path, 1 << 30) > 1 << 30
    good = _check(path, 4)
    print(f"1 GiB ONNX check: {good['seconds'] * 1000:.1f} ms, peak RSS growth {good['growth'] >> 10} KiB")
    assert good["problems"] == []
    assert good["growth"] < 16 << 20 and good["seconds"] < 5
    bad = _check(path, 5)  # a mismatch is still found, with the same flat memory
    assert (
        "version 1: input 'IN' has dims [5] in the config but [4] (without the batch dimension) in the ONNX model"
        in bad["problems"][0]
    )
    assert bad["growth"] < 16 << 20
