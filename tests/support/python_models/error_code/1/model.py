import numpy as np

# Triton's stub sets pb_utils.TritonError only after model.py is imported: use it inside functions
import triton_python_backend_utils as pb_utils

CODES = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED"]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            code = pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0].decode()
            if code == "RAISE":
                raise ValueError("the model raised on purpose")
            if code == "MODEL_EXCEPTION":
                raise pb_utils.TritonModelException("a TritonModelException on purpose")
            if code == "WRONG_COUNT":
                return []
            if code == "NOT_A_LIST":
                return "not a list"
            if code == "BAD_ITEM":
                return ["not a response"] * len(requests)
            if code == "OK":
                responses.append(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([b"ok"], dtype=np.object_))])
                )
            elif code in CODES:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("error code: " + code, getattr(pb_utils.TritonError, code))
                    )
                )
            else:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("unrecognized error code: " + code))
                )
        return responses
