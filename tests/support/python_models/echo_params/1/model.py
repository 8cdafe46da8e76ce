import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            requested = json.dumps(sorted(request.requested_output_names()))
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("PARAMS", np.array([params.encode()], dtype=np.object_)),
                        pb_utils.Tensor("REQUESTED", np.array([requested.encode()], dtype=np.object_)),
                        pb_utils.Tensor("OUT", values),
                    ]
                )
            )
        return responses
