"""CIFAR-10 postprocessing: logits [10] → the class name as a BYTES tensor [1]."""

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()  # [batch, 10]
            names = np.array([[CLASSES[i].encode()] for i in logits.argmax(axis=1)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("CLASS", names)]))
        return responses
