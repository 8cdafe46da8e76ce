import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.answer(r) for r in requests))
        return None

    async def answer(self, request):
        waits = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()
        sender = request.get_response_sender()
        await asyncio.gather(*(asyncio.sleep(float(w)) for w in waits.reshape(-1)))
        out = pb_utils.Tensor("DUMMY_OUT", np.zeros(waits.shape, dtype=np.float32))
        sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
