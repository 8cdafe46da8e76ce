import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            command = json.loads(pb_utils.get_input_tensor_by_name(request, "COMMAND").as_numpy()[0])
            try:
                result = {"ok": self.run(command)}
            except pb_utils.TritonModelException as exc:
                result = {"error": type(exc).__name__, "message": str(exc)}
            out = np.array([json.dumps(result)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", out)]))
        return responses

    def run(self, command):
        op, name = command["op"], command["name"]
        if op == "load":
            files = command.get("files")
            if isinstance(files, dict):
                files = {path: text.encode() for path, text in files.items()}
            return pb_utils.load_model(name, config=command.get("config", ""), files=files)
        if op == "unload":
            return pb_utils.unload_model(name, unload_dependents=command.get("dependents", False))
        if op == "ready":
            return pb_utils.is_model_ready(name, command.get("version", ""))
        raise pb_utils.TritonModelException(f"unknown op {op}")
