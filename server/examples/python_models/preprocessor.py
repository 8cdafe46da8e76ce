"""CIFAR-10 preprocessing: a UINT8 HWC image of any size → normalized FP32 CHW [3, 32, 32].

Bilinear resize in numpy (no PIL), then CIFAR-10 channel mean/std normalization. ``preprocess`` is a
plain function so clients can reproduce the step exactly.
"""

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

SIZE = 32
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an HWC float image (half-pixel centers, as OpenCV/PIL)."""
    h, w = image.shape[:2]
    ys = np.clip((np.arange(height, dtype=np.float32) + 0.5) * (h / height) - 0.5, 0, h - 1)
    xs = np.clip((np.arange(width, dtype=np.float32) + 0.5) * (w / width) - 0.5, 0, w - 1)
    y0 = np.floor(ys).astype(np.int64)
    x0 = np.floor(xs).astype(np.int64)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    wy = (ys - y0)[:, None, None]
    wx = (xs - x0)[None, :, None]
    top = image[y0][:, x0] * (1 - wx) + image[y0][:, x1] * wx
    bottom = image[y1][:, x0] * (1 - wx) + image[y1][:, x1] * wx
    out: np.ndarray = top * (1 - wy) + bottom * wy
    return out


def preprocess(image: np.ndarray) -> np.ndarray:
    """[H, W, 3] uint8 → [3, 32, 32] float32."""
    x = resize_bilinear(image.astype(np.float32) / 255.0, SIZE, SIZE)
    x = (x - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()  # [batch, H, W, 3]
            if images.shape[1] < 1 or images.shape[2] < 1:
                error = pb_utils.TritonError(
                    f"IMAGE must be at least 1x1 pixels, got {images.shape[1]}x{images.shape[2]}",
                    pb_utils.TritonError.INVALID_ARG,
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = np.stack([preprocess(img) for img in images])
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("INPUT", out)]))
        return responses
