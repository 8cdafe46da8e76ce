import json

import helper
import numpy as np
import shared
import triton_python_backend_utils as pb_utils
from helpers.ops import scale

from . import relative


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            import helper as again  # a later import inside execute gets the same (this instance's) module

            info = {
                "instance": self.instance,
                "helper_calls": helper.calls,
                "relative_calls": relative.bump(),
                "same_helper": again is helper,
                "shared": shared.NAME,
                "offset": helper.OFFSET,
                "model_dir": pb_utils.get_model_dir(),
            }
            out = scale(helper.add_offset(x))
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([out], np.int32)),
                        pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_)),
                    ]
                )
            )
        return responses
