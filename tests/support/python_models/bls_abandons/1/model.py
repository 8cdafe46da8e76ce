import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            repeat = pb_utils.InferenceRequest(
                model_name="repeat_int32",
                inputs=[
                    pb_utils.Tensor("IN", np.array([1, 2, 3], dtype=np.int32)),
                    # the later responses come after this model has dropped the iterator
                    pb_utils.Tensor("DELAY", np.array([0, 300, 300], dtype=np.uint32)),
                    pb_utils.Tensor("WAIT", np.array([0], dtype=np.uint32)),
                ],
                requested_output_names=["OUT"],
                request_id=request.request_id(),
                trace=request.trace(),
            )
            first = next(iter(repeat.exec(decoupled=True)))
            if first.has_error():
                raise pb_utils.TritonModelException(first.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return responses
