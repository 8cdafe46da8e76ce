import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def text(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value.encode()], dtype=np.object_))])


class TritonPythonModel:
    last_error = ""

    def execute(self, requests):
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            sender = request.get_response_sender()
            if mode == "RETURN_RESPONSES":
                return [text("returned")]
            if mode == "RAISE_AFTER_SEND":
                sender.send(text("first"))
                raise ValueError("raised after one response")
            if mode == "RAISE":
                raise ValueError("raised before any response")
            if mode == "SEND_AFTER_FINAL":
                sender.send(text("only"), FINAL)
                try:
                    sender.send(text("too late"))
                except Exception as exc:
                    TritonPythonModel.last_error = f"{type(exc).__name__}: {exc}"
            elif mode == "BAD_FLAGS":
                try:
                    sender.send(text("x"), flags=7)
                except Exception as exc:
                    TritonPythonModel.last_error = f"{type(exc).__name__}: {exc}"
                sender.send(flags=FINAL)
            elif mode == "NO_RESPONSE_NO_FLAGS":
                try:
                    sender.send()
                except Exception as exc:
                    TritonPythonModel.last_error = f"{type(exc).__name__}: {exc}"
                sender.send(flags=FINAL)
            elif mode == "ERROR_RESPONSE":
                sender.send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("bad token", pb_utils.TritonError.INVALID_ARG)
                    )
                )
                sender.send(text("after the error"))
                sender.send(flags=FINAL)
            elif mode == "LAST_ERROR":
                sender.send(text(TritonPythonModel.last_error), FINAL)
            else:
                sender.send(text(mode), FINAL)
        return None
