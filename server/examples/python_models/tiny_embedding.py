"""A toy text embedding model (CPU, no weights): hashed bag of words → an L2-normalised FP32 vector.

``text_input`` (BYTES, batched) → ``embedding`` (FP32 [16]): each lower-cased word adds 1 at index
``crc32(word) % 16``; the vector is then scaled to unit length (all zeros for a text without words).
Deterministic, so tests can assert exact vectors.
"""

import zlib
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

DIMS = 16


def embed(text: str) -> np.ndarray:
    vector = np.zeros(DIMS, dtype=np.float32)
    for word in text.lower().split():
        vector[zlib.crc32(word.encode("utf-8")) % DIMS] += 1.0
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()  # [batch, 1]
            first = texts.reshape(len(texts), -1)[:, 0]
            rows = [embed(t.decode("utf-8") if isinstance(t, bytes) else str(t)) for t in first]
            out = np.stack(rows).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("embedding", out)]))
        return responses
