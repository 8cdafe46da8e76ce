"""Triton's ``iterative_sequence`` test backend (server qa/L0_iterative_sequence, backend
src/test/iterative_sequence) as a Python model, and the python_backend docs' "Request Rescheduling" example.

INT32 ``INPUT`` [1] is how many responses the request produces; each execution answers one: ``OUTPUT`` is
the number still to come. While some remain the model releases the request with
``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` and is executed again with the same request; its count is kept
by the model, per correlation id (as the C++ backend's ``remainders_``). ``FLAGS`` and ``CORRID`` echo what
the request showed (``request.flags()``, ``request.correlation_id()``).

Decoupled: every response goes through the response sender, the last with
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. Not decoupled: only the last execution answers; the rescheduled
ones return ``None`` for the request (python_backend's rule). Parameter ``release_all`` (bool): release
with ``TRITONSERVER_REQUEST_RELEASE_ALL`` instead, ending the sequence early.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.batching = config.get("max_batch_size", 0) > 0
        self.remainders = {}

    def _tensor(self, name, value, dtype):
        array = np.array([[value]] if self.batching else [value], dtype=dtype)
        return pb_utils.Tensor(name, array)

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = request.correlation_id()
            initial = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            remaining = self.remainders.get(corrid, initial) - 1
            params = json.loads(request.parameters())
            response = pb_utils.InferenceResponse(
                output_tensors=[
                    self._tensor("OUTPUT", remaining, np.int32),
                    self._tensor("FLAGS", request.flags(), np.int32),
                    self._tensor("CORRID", int(corrid), np.uint64),
                ]
            )
            done = remaining <= 0 or params.get("release_all", False)
            if done:
                self.remainders.pop(corrid, None)
            else:
                self.remainders[corrid] = remaining
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            if self.decoupled:
                sender = request.get_response_sender()
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0)
            else:
                responses.append(response if done else None)
        return None if self.decoupled else responses
