import numpy as np
import triton_python_backend_utils as pb_utils

OUTPUTS = {
    # INT64 where the config says INT32 (python_backend's bls_decoupled example does this)
    "INT64": lambda: [pb_utils.Tensor("OUT", np.array([[7, 8]], dtype=np.int64))],
    # shape [1] where the config says [-1, -1]
    "RANK1": lambda: [pb_utils.Tensor("OUT", np.array([5], dtype=np.int32))],
    # FP32 and a fixed shape of another rank
    "FP32": lambda: [pb_utils.Tensor("OUT", np.array([[[1.5]]], dtype=np.float32))],
    # an output the config does not name, next to OUT
    "EXTRA": lambda: [
        pb_utils.Tensor("OUT", np.array([[1, 2]], dtype=np.int32)),
        pb_utils.Tensor("EXTRA", np.array([9], dtype=np.int32)),
    ],
}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            responses.append(pb_utils.InferenceResponse(OUTPUTS[mode]()))
        return responses
