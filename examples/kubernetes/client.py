"""Call the cifar10-resnet InferenceModel through its server's Service with NVIDIA's tritonclient.

python examples/kubernetes/client.py <CLUSTER-IP>      # kubectl get service cpu-pool
"""

import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

host = sys.argv[1] if len(sys.argv) > 1 else "localhost"
image = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)

http = httpclient.InferenceServerClient(f"{host}:8000")
inp = httpclient.InferInput("input", list(image.shape), "FP32")
inp.set_data_from_numpy(image)
logits = http.infer("cifar10-resnet", [inp]).as_numpy("output")
print("HTTP: class", int(logits.argmax()), "logits", logits.round(3).tolist())

grpc = grpcclient.InferenceServerClient(f"{host}:8001")
inp = grpcclient.InferInput("input", list(image.shape), "FP32")
inp.set_data_from_numpy(image)
logits = grpc.infer("cifar10-resnet", [inp]).as_numpy("output")
print("gRPC: class", int(logits.argmax()), "ready:", grpc.is_model_ready("cifar10-resnet"))
