"""A Triton Python model that writes its ``initialize`` args to ``$CONFIG_PARITY_OUT/<instance>.json``
and answers each output with the input in the same position (it runs unchanged on Triton 2.51)."""

import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        out = os.environ.get("CONFIG_PARITY_OUT")
        if out:
            with open(os.path.join(out, args["model_instance_name"] + ".json"), "w", encoding="utf-8") as f:
                json.dump(args, f)
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for i, o in zip(self.config["input"], self.config["output"], strict=False):
                tensor = pb_utils.get_input_tensor_by_name(request, i["name"])
                outputs.append(pb_utils.Tensor(o["name"], tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
