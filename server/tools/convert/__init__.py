"""Convert an ONNX model into a TensorRT plan inside a model repository.

Writes ``<repo>/<model>/<version>/model.plan`` and a matching ``<repo>/<model>/config.pbtxt``
(platform tensorrt_plan, GPU instances, dynamic batching), staged and renamed as the repository's
atomic-write contract asks. With ``--int8`` the entropy calibration cache is written next to the plan
(``calibration.cache``) and reused by the next build. After the build the engine runs against
onnxruntime on the same inputs and the max abs/rel error and the speed-up are printed.

Example:
  kubeinfer convert model.onnx --repository models --name resnet --fp16 --max-batch 32
"""

# The docstring above is the command's help text. One module per job: options (flags and their checks),
# shapes (signature, profile, config.pbtxt), calibrate (INT8), tensorrt (the build), write (into the
# repository), verify (against onnxruntime), cli (the command); messages (ConvertError, progress lines).

from __future__ import annotations

from ...config import config_to_text
from .calibrate import load_calibration
from .cli import run
from .layout import CALIBRATION_CACHE, PLAN_FILE, Layout, plan_layout
from .messages import ConvertError, say
from .options import ConvertOptions, add_arguments, batch_range, check_options, options_from_args
from .shapes import Signature, profile_shapes, read_signature, render_config
from .tensorrt import build_engine
from .verify import compare, error_stats, median_ms, sample_inputs
from .write import write_model

__all__ = [
    "CALIBRATION_CACHE",
    "PLAN_FILE",
    "ConvertError",
    "ConvertOptions",
    "Layout",
    "Signature",
    "add_arguments",
    "batch_range",
    "build_engine",
    "check_options",
    "compare",
    "config_to_text",
    "error_stats",
    "load_calibration",
    "median_ms",
    "options_from_args",
    "plan_layout",
    "profile_shapes",
    "read_signature",
    "render_config",
    "run",
    "sample_inputs",
    "say",
    "write_model",
]
