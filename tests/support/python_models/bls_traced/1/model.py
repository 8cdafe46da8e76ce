import numpy as np
import triton_python_backend_utils as pb_utils


def _call(model, x, request, trace):
    inputs = [pb_utils.Tensor("A", x), pb_utils.Tensor("B", x)]
    bls = pb_utils.InferenceRequest(
        model_name=model,
        inputs=inputs,
        requested_output_names=["OUT"],
        request_id=request.request_id(),
        **({"trace": request.trace()} if trace else {}),
    )
    response = bls.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            traced = _call("add", x, request, trace=True)
            untraced = _call("add2", x, request, trace=False)
            repeat = pb_utils.InferenceRequest(
                model_name="repeat_int32",
                inputs=[
                    pb_utils.Tensor("IN", np.array([1, 2], dtype=np.int32)),
                    pb_utils.Tensor("DELAY", np.array([0, 0], dtype=np.uint32)),
                    pb_utils.Tensor("WAIT", np.array([0], dtype=np.uint32)),
                ],
                requested_output_names=["OUT"],
                request_id=request.request_id(),
                trace=request.trace(),
            )
            seen = [r for r in repeat.exec(decoupled=True) if r.output_tensors()]
            if len(seen) != 2:
                raise pb_utils.TritonModelException(f"repeat_int32 sent {len(seen)} responses, expected 2")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", traced + untraced)]))
        return responses
