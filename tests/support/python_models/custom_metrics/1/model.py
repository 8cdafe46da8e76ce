import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests_family = pb_utils.MetricFamily(
            name="requests_seen_total", description="Requests this model executed", kind=pb_utils.MetricFamily.COUNTER
        )
        self.last_family = pb_utils.MetricFamily(
            name="last_input_value", description="The last input value", kind=pb_utils.MetricFamily.GAUGE
        )
        self.values_family = pb_utils.MetricFamily(
            name="input_values", description="Input values", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        self.requests = self.requests_family.Metric(labels=labels)
        self.last = self.last_family.Metric(labels=labels)
        self.values = self.values_family.Metric(labels=labels, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(value)
            self.values.observe(value)
            refusals = []
            for attempt in (lambda: self.requests.increment(-1), lambda: self.requests.set(1)):
                try:
                    attempt()
                except pb_utils.TritonModelException as exc:
                    refusals.append(str(exc).encode())
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("COUNT", np.array([self.requests.value()], np.float32)),
                        pb_utils.Tensor("REFUSALS", np.array(refusals, dtype=np.object_)),
                    ]
                )
            )
        return responses
