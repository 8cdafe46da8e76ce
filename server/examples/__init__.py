"""The example model repository shipped with kubeinfer (configs here; ONNX files generated)."""
