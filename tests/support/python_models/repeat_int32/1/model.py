import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("repeat_int32 needs model_transaction_policy { decoupled: true }")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            if values.shape != delays.shape:
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            "IN and DELAY must have the same shape", pb_utils.TritonError.INVALID_ARG
                        )
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            sender = request.get_response_sender()
            # test-only: the request parameter "gate" names a folder; the first response waits for <gate>/open
            gate = json.loads(request.parameters() or "{}").get("gate")
            args = (sender, request.request_id(), values, delays, int(wait[0]), gate)
            thread = threading.Thread(target=self.respond, args=args)
            thread.daemon = True
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, request_id, values, delays, wait_ms, gate=None):
        time.sleep(wait_ms / 1000)
        deadline = time.monotonic() + 120
        while gate and not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < deadline:
            time.sleep(0.005)
        for idx, (value, delay) in enumerate(zip(values, delays, strict=True)):
            time.sleep(int(delay) / 1000)
            if sender.is_cancelled():
                pb_utils.Logger.log_info(f"repeat_int32: request {request_id} cancelled after {idx} responses")
                break
            sender.send(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([idx], dtype=np.uint32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=30)
