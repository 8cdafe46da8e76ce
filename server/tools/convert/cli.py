"""``kubeinfer convert`` for an ONNX model: check, build, write, compare, each step's result on stdout."""

from __future__ import annotations

from ...config import config_to_text
from .layout import plan_layout
from .messages import say
from .options import ConvertOptions, check_options
from .shapes import read_signature, render_config
from .tensorrt import build_engine
from .verify import compare
from .write import write_model


def run(options: ConvertOptions) -> int:
    check_options(options)
    sig = read_signature(options.onnx)
    config = render_config(options, sig)  # before the slow build: bad dims fail now
    layout = plan_layout(options)
    plan, cache = build_engine(options, sig, layout)
    write_model(options, layout, plan, cache, config_to_text(config))
    print(f"wrote {layout.plan} ({len(plan) / 1e6:.1f} MB)")
    if cache is not None:
        print(f"wrote {layout.calibration_cache}")
    print(f"wrote {layout.config}")
    if options.compare:
        say("comparing the engine with onnxruntime on the same inputs")
        report = compare(options, sig, plan)
        for name, (max_abs, max_rel) in report["errors"].items():
            print(f"output '{name}': max abs error {max_abs:.3g}, max rel error {max_rel:.3g}")
        print(
            f"batch {report['batch']}: onnxruntime ({report['onnxruntime_provider']}) "
            f"{report['onnxruntime_ms']:.3f} ms, TensorRT {report['tensorrt_ms']:.3f} ms, "
            f"speed-up {report['speedup']:.2f}x"
        )
    return 0
