import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(name, values, dtype):
    return pb_utils.Tensor(name, np.array(values, dtype=dtype))


def describe(response):
    if response.has_error():
        return {"error": response.error().message(), "code": int(response.error().code())}
    out = {}
    for t in response.output_tensors():
        value = t.as_numpy().tolist()
        out[t.name()] = [v.decode() if isinstance(v, bytes) else v for v in value]
    return out


def repeat_request(values, model_name="repeat_int32", **kwargs):
    return pb_utils.InferenceRequest(
        model_name=model_name,
        inputs=[
            tensor("IN", values, np.int32),
            tensor("DELAY", [10] * len(values), np.uint32),
            tensor("WAIT", [0], np.uint32),
        ],
        requested_output_names=kwargs.pop("requested_output_names", ["OUT", "IDX"]),
        **kwargs,
    )


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            try:
                result = await self.run(mode)
            except Exception as exc:
                result = {"exception": f"{type(exc).__name__}: {exc}"}
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([json.dumps(result).encode()], dtype=np.object_))]
                )
            )
        return responses

    async def run(self, mode):
        if mode == "SYNC":
            return [describe(r) for r in repeat_request([1, 2, 3]).exec(decoupled=True)]
        if mode == "ASYNC":
            iterator = await repeat_request([4, 5]).async_exec(decoupled=True)
            return [describe(r) for r in iterator]
        if mode == "ASYNC_TWO":
            a, b = await asyncio.gather(
                repeat_request([1]).async_exec(decoupled=True), repeat_request([2, 3]).async_exec(decoupled=True)
            )
            return [[describe(r) for r in a], [describe(r) for r in b]]
        if mode == "REQUESTED":
            return [describe(r) for r in repeat_request([9], requested_output_names=["IDX"]).exec(decoupled=True)]
        if mode == "BYTES_NAME":
            return [describe(r) for r in repeat_request([6], model_name=b"repeat_int32").exec(decoupled=True)]
        if mode == "NON_DECOUPLED_CALL":
            return describe(repeat_request([1, 2]).exec())
        if mode == "DECOUPLED_CALL_TO_PLAIN":
            req = pb_utils.InferenceRequest(
                model_name="echo_params", inputs=[tensor("IN", [3], np.int32)], requested_output_names=["OUT"]
            )
            return [describe(r) for r in req.exec(decoupled=True)]
        if mode == "PARAMS":
            req = pb_utils.InferenceRequest(
                model_name="echo_params",
                inputs=[tensor("IN", [1], np.int32)],
                requested_output_names=["PARAMS", "REQUESTED"],
                parameters={"a": 1, "b": "two", "c": True},
                timeout=5_000_000,
            )
            return describe(req.exec())
        if mode == "UNKNOWN_MODEL":
            return [describe(r) for r in repeat_request([1], model_name="no_such_model").exec(decoupled=True)]
        if mode == "UNKNOWN_MODEL_PLAIN":
            return describe(repeat_request([1], model_name="no_such_model").exec())
        if mode.startswith("CALLEE_"):
            req = pb_utils.InferenceRequest(
                model_name="error_code",
                inputs=[pb_utils.Tensor("CODE", np.array([mode[len("CALLEE_") :].encode()], dtype=np.object_))],
                requested_output_names=["OUT"],
            )
            return [describe(req.exec()), [describe(r) for r in req.exec(decoupled=True)]]
        if mode == "ERRORS":
            req = pb_utils.InferenceRequest(
                model_name="decoupled_misuse",
                inputs=[pb_utils.Tensor("MODE", np.array([b"ERROR_RESPONSE"], dtype=np.object_))],
                requested_output_names=["OUT"],
            )
            return [describe(r) for r in req.exec(decoupled=True)]
        return {"unknown mode": mode}
