import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            pb_utils.Logger.log_info(f"cancellable: request {request.request_id()} started")
            deadline = time.monotonic() + seconds
            cancelled = False
            while time.monotonic() < deadline:
                if request.is_cancelled():
                    cancelled = True
                    break
                time.sleep(0.01)
            if cancelled:
                pb_utils.Logger.log_info(f"cancellable: request {request.request_id()} cancelled")
                error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([seconds], np.float32))]))
        return responses
