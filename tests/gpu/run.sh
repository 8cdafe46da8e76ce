#!/usr/bin/env bash
# Runs every GPU test (TensorRT FP16/INT8 builds, plan serving with batching, ORT CUDA and TensorRT EPs,
# instance groups pinned to gpus: [0], PyTorch on KIND_GPU, TorchScript and SavedModel → TensorRT) and prints a
# summary.
# Needs an NVIDIA GPU plus
# `pip install -e .[gpu,dev,pytorch,tensorflow]`, then `pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu`
# (both ONNX Runtime packages own the `onnxruntime` module: the CPU one can hide the CUDA provider).
# Missing GPU packages fail the run (KUBEINFER_GPU_STRICT=1) instead of skipping.
#   tests/gpu/run.sh [extra pytest args]
set -u
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
echo "== GPU environment"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi not found"
"$PY" - <<'PYEOF'
import importlib.util
for name in ("tensorrt", "onnxruntime", "cuda", "torch", "tensorflow"):
    spec = importlib.util.find_spec(name)
    if spec is None:
        print(f"{name}: not installed")
        continue
    module = __import__(name)
    print(f"{name}: {getattr(module, '__version__', 'installed')}")
import onnxruntime
print("onnxruntime providers:", ", ".join(onnxruntime.get_available_providers()))
PYEOF
report="$(mktemp -d)/gpu-junit.xml"
echo "== GPU tests"
KUBEINFER_GPU_STRICT="${KUBEINFER_GPU_STRICT:-1}" "$PY" -m pytest tests/gpu -m gpu -v -rA -p no:cacheprovider \
    --timeout 3600 --junitxml="$report" "$@"
rc=$?
echo "== summary"
"$PY" - "$report" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("no test report was written")
    sys.exit(0)
suite = root if root.tag == "testsuite" else root.find("testsuite")
for case in suite.iter("testcase"):
    outcome = "PASS"
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            outcome = tag.upper()
    print(f"{outcome:8s} {case.get('classname')}::{case.get('name')} ({float(case.get('time', 0)):.1f}s)")
print(f"tests={suite.get('tests')} failures={suite.get('failures')} errors={suite.get('errors')} "
      f"skipped={suite.get('skipped')} time={float(suite.get('time', 0)):.0f}s")
PYEOF
exit $rc
