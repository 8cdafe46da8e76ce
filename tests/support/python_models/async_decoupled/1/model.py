import asyncio
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.answer(r) for r in requests))
        return None

    async def answer(self, request):
        n, delay_ms = (int(v) for v in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
        sender = request.get_response_sender()
        # test-only: the request parameter "gate" names a folder; the first response waits for <gate>/open
        gate = json.loads(request.parameters() or "{}").get("gate")
        deadline = time.monotonic() + 120
        while gate and not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for i in range(n):
            await asyncio.sleep(delay_ms / 1000)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
