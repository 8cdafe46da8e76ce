import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0].decode()
            delay_ms = json.loads(request.parameters()).get("delay_ms", 0)
            args = (request, request.get_response_sender(), text.split(), delay_ms)
            threading.Thread(target=self.generate, args=args, daemon=True).start()
        return None

    def generate(self, request, sender, words, delay_ms):
        for i, word in enumerate(words):
            time.sleep(delay_ms / 1000)
            if sender.is_cancelled():
                pb_utils.Logger.log_info(f"text_generator: request {request.request_id()} cancelled after {i} words")
                break
            out = pb_utils.Tensor("text_output", np.array([word.encode()], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
