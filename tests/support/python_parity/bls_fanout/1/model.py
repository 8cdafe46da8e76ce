import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils


def bls_request(request):
    waits = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()
    return pb_utils.InferenceRequest(
        model_name="bls_sleeper",
        inputs=[pb_utils.Tensor("WAIT_SECONDS", waits)],
        requested_output_names=["DUMMY_OUT"],
    )


def copy(bls_response):
    if bls_response.has_error():
        raise pb_utils.TritonModelException(bls_response.error().message())
    out = pb_utils.get_output_tensor_by_name(bls_response, "DUMMY_OUT").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("DUMMY_OUT", out)])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.mode = config["parameters"]["MODE"]["string_value"]
        if self.mode == "async":
            self.execute = self.execute_decoupled
        elif self.mode == "gather":
            self.execute = self.execute_gather
        else:
            self.execute = self.execute_threads

    async def execute_decoupled(self, requests):
        async def one(request):
            sender = request.get_response_sender()
            for bls_response in await bls_request(request).async_exec(decoupled=True):
                if bls_response.output_tensors() or bls_response.has_error():
                    sender.send(copy(bls_response))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        await asyncio.gather(*(one(r) for r in requests))
        return None

    async def execute_gather(self, requests):
        answers = await asyncio.gather(*(bls_request(r).async_exec(decoupled=True) for r in requests))
        return [copy(next(iter(a))) for a in answers]

    def execute_threads(self, requests):
        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(lambda r: copy(next(iter(bls_request(r).exec(decoupled=True)))), requests))
