import asyncio
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RETURN, PRE, PRE_FINAL, POST, POST_FINAL, TWO_PRE, FINAL_FIRST, PRE_AND_RETURN, RETURN_AND_POST = range(9)


def response(code):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[code]], dtype=np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        if params.get("ASYNC", {}).get("string_value") == "true":
            self.execute = self.execute_async
        self.tasks = set()

    def execute(self, requests):
        returned, later = self.before_return(requests)
        threading.Thread(target=self.after_return, args=(later, 0.3), daemon=True).start()
        return returned

    async def execute_async(self, requests):
        returned, later = self.before_return(requests)
        await asyncio.sleep(0)
        task = asyncio.create_task(self.after_return_async(later))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return returned

    def before_return(self, requests):
        returned, later = [], []
        for request in requests:
            path = int(pb_utils.get_input_tensor_by_name(request, "PATH").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            answer = None
            if path == RETURN:
                answer = response(100)
            elif path == PRE:
                sender.send(response(200))
                sender.send(flags=FINAL)
            elif path == PRE_FINAL:
                sender.send(response(201), FINAL)
            elif path in (POST, POST_FINAL):
                later.append((path, sender))
            elif path == TWO_PRE:
                sender.send(response(210))
                sender.send(response(211))  # raises: one response only
            elif path == FINAL_FIRST:
                sender.send(flags=FINAL)  # raises: a final needs a response first
            elif path == PRE_AND_RETURN:
                sender.send(response(220), FINAL)
                answer = response(120)  # refused: the request is complete
            elif path == RETURN_AND_POST:
                answer = response(130)
                later.append((path, sender))
            returned.append(answer)
        return (None if all(a is None for a in returned) else returned), later

    def after_return(self, later, delay):
        time.sleep(delay)
        self.send_late(later)

    async def after_return_async(self, later):
        await asyncio.sleep(0.3)
        self.send_late(later)

    def send_late(self, later):
        for path, sender in later:
            if path == POST:
                sender.send(response(300))
                sender.send(flags=FINAL)
            elif path == POST_FINAL:
                sender.send(response(301), FINAL)
            elif path == RETURN_AND_POST:
                sender.send(response(330), FINAL)  # raises: the returned response completed the request
