"""``kubeinfer convert model.savedmodel``: a TensorFlow SavedModel → ONNX (→ TensorRT), each a new model version.

The source is a SavedModel folder (``saved_model.pb`` inside). Its config comes from ``--config``, or the one
two folders up when it sits in a repository as ``<model>/<version>/model.savedmodel``, completed from the
serving signature by the server's own rules (``--signature`` / ``--tag`` pick another signature or graph, as
``TF_SIGNATURE_DEF`` / ``TF_GRAPH_TAG`` do). tf2onnx (``python -m tf2onnx.convert``, its command line)
converts that signature; the ONNX graph keeps the signature's tensor names, so clients call it unchanged.
It is written as ``<repository>/<name>/<next version>/model.onnx`` with an ``onnxruntime_onnx`` config and
run against the SavedModel (in a session, as the server runs it) on the same inputs: the largest output
difference and the speed of each are printed. ``--tensorrt`` builds a plan from the ONNX model as for
PyTorch sources (a GPU with TensorRT).

  kubeinfer convert models/classifier/1/model.savedmodel --repository models --name classifier_onnx
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, config_to_text, pb
from ..config.platforms import BY_PLATFORM
from . import convert_torch
from .convert import ConvertError, say

ONNX_FILE = BY_PLATFORM["onnxruntime_onnx"].model_filename
PLATFORM = "tensorflow_savedmodel"


def is_savedmodel_source(path: Path) -> bool:
    return path.is_dir() and ((path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags for SavedModel sources (--config, --opset, --tensorrt and the rest are shared)."""
    group = p.add_argument_group("TensorFlow sources (model.savedmodel)")
    group.add_argument("--signature", help="the signature to convert (TF_SIGNATURE_DEF; default serving_default)")
    group.add_argument("--tag", help="the MetaGraphDef's tag (TF_GRAPH_TAG; default serve)")


@dataclass
class TFConvertOptions(convert_torch.TorchConvertOptions):
    signature: str | None = None
    tag: str | None = None


def options_from_args(args: argparse.Namespace) -> TFConvertOptions:
    base = convert_torch.options_from_args(args)
    return TFConvertOptions(**vars(base), signature=args.signature, tag=args.tag)


def source_config(options: TFConvertOptions) -> tuple[pb.ModelConfig, Path]:
    """The SavedModel's config, completed from its signature, and the "version folder" it is read from."""
    from ..backends.tensorflow import TensorFlowBackend

    config = convert_torch.source_config(options) or pb.ModelConfig(platform=PLATFORM)
    if config.platform and config.platform != PLATFORM:
        raise ConvertError(f"the config says platform '{config.platform}', not {PLATFORM}")
    config.platform = PLATFORM
    config.name = config.name or options.name
    source = options.source.resolve()
    config.default_model_filename = source.name
    for key, value in (("TF_SIGNATURE_DEF", options.signature), ("TF_GRAPH_TAG", options.tag)):
        if value:
            config.parameters[key].string_value = value
    try:
        TensorFlowBackend.auto_complete_config(config, source.parent)
        if options.max_batch is not None and config.max_batch_size > 0:
            config.max_batch_size = options.max_batch
        TensorFlowBackend.validate_model(config, source.parent)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    return config, source.parent


def run(options: TFConvertOptions) -> dict[str, Any]:
    """Convert, write, compare; returns the report that is also printed."""
    from ..backends.tensorflow import require_tensorflow
    from ..backends.tensorflow.backend import TensorFlowInstance, _Session, _Sessions, read_signature
    from ..backends.tensorflow.parameters import parse_parameters
    from ..repository.layout import check_model_name
    from ..vocabulary.errors import InvalidArgument, Unavailable

    try:
        check_model_name(options.name)
    except InvalidArgument as exc:
        raise ConvertError(str(exc)) from None
    if not is_savedmodel_source(options.source):
        raise ConvertError(f"'{options.source}' is not a SavedModel folder (no saved_model.pb in it)")
    if not options.repository.is_dir():
        raise ConvertError(f"model repository '{options.repository}' is not a folder")
    try:
        require_tensorflow()
    except Unavailable as exc:
        raise ConvertError(str(exc)) from None
    if importlib.util.find_spec("tf2onnx") is None:
        raise ConvertError("tf2onnx is not installed: pip install kubeinfer[tensorflow]")
    config, version_path = source_config(options)
    params = parse_parameters(config)
    sig = read_signature(config, version_path, params)
    batching = config.max_batch_size > 0
    compare_batch = min(config.max_batch_size, 8) if batching else 1
    inputs = convert_torch.sample_inputs(config, options.input_shapes, compare_batch)
    session = _Sessions().take("", 1, lambda: _Session(config, sig, options.source, options.source, params, None))
    instance = TensorFlowInstance(config, session)
    outputs = [t.name for t in config.output]

    def runner(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        result = instance.run(feed, outputs)
        return [result[n] for n in outputs]

    try:
        reference = dict(zip(outputs, runner(inputs), strict=True))
        model_dir = options.repository / options.name
        version = options.version or convert_torch._next_version(model_dir)
        report: dict[str, Any] = {"onnx": {}, "tensorrt": None}
        with tempfile.TemporaryDirectory(prefix=".convert-", dir=options.repository) as tmp:
            onnx_path = Path(tmp) / ONNX_FILE
            say(f"converting {options.source} (signature '{sig.key}', tag '{sig.tag}') to ONNX with tf2onnx")
            tf2onnx(options.source, onnx_path, sig.key, sig.tag, options.opset)
            rendered = convert_torch.onnx_config(config, options.name)
            convert_torch._check_onnx(rendered, onnx_path)
            report["onnx"] = convert_torch._compare_onnx(onnx_path, runner, inputs, reference, options.compare_runs)
            version_dir = convert_torch.write_version(
                model_dir,
                version,
                {ONNX_FILE: onnx_path},
                config_to_text(rendered),
                bool(options.trt_args.get("force")),
            )
            report["onnx"].update(path=str(version_dir / ONNX_FILE), version=version, batch=compare_batch)
            convert_torch._print("ONNX", report["onnx"], "SavedModel", "TensorFlow")
            if options.tensorrt:
                report["tensorrt"] = convert_torch._build_tensorrt(
                    options, config, version_dir / ONNX_FILE, runner, inputs, reference
                )
                convert_torch._print("TensorRT", report["tensorrt"], "SavedModel", "TensorFlow")
    finally:
        instance.close()
    return report


def tf2onnx(source: Path, target: Path, signature: str, tag: str, opset: int) -> None:
    """tf2onnx's command line (its public interface): the signature's keys become the ONNX tensor names."""
    command = [
        sys.executable,
        "-m",
        "tf2onnx.convert",
        "--saved-model",
        str(source),
        "--output",
        str(target),
        "--signature_def",
        signature,
        "--tag",
        tag,
        "--opset",
        str(opset),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not target.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ConvertError(f"tf2onnx could not convert {source} (signature '{signature}'):\n{tail}")
