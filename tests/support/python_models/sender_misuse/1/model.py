import threading
import time

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
            if mode == "ONE":
                sender.send(text("one"), FINAL)
            elif mode == "TWO":
                sender.send(text("first"))
                try:
                    sender.send(text("second"))
                except Exception as exc:
                    TritonPythonModel.last_error = f"{type(exc).__name__}: {exc}"
                sender.send(flags=FINAL)
            elif mode == "FINAL_ONLY":
                try:
                    sender.send(flags=FINAL)
                except Exception as exc:
                    TritonPythonModel.last_error = f"{type(exc).__name__}: {exc}"
                sender.send(text("answered after the refused final"), FINAL)
            elif mode == "LATE":
                threading.Thread(target=self.late, args=(sender,), daemon=True).start()
            elif mode == "RETURN_TOO":
                sender.send(text("sent"), FINAL)
                return [text("returned")]
            elif mode == "LAST_ERROR":
                sender.send(text(TritonPythonModel.last_error), FINAL)
        return None

    def late(self, sender):
        time.sleep(0.2)
        sender.send(text("late"), FINAL)
