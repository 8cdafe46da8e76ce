import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)

    def execute(self, requests):
        text = json.dumps(self.args).encode()
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([text], dtype=np.object_))]) for _ in requests
        ]
