"""A toy text "language model" that follows the generate-extension conventions (decoupled, CPU, no weights).

``text_input`` (BYTES) → ``text_output`` (BYTES), one response per word: it answers the last ``user: ...``
line of the prompt (the OpenAI frontend's default chat template, docs/api/openai.md), or the
whole prompt when there is none, with its words in reverse order. ``max_tokens`` (INT32, optional, default
16) caps the words; the request parameter ``stop`` (a word, or a JSON list of words) ends the answer before
that word. Deterministic, so tests can assert exact text.
"""

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULT_MAX_TOKENS = 16


def answer(prompt: str) -> list[str]:
    lines = [line for line in prompt.splitlines() if line.startswith("user:")]
    text = lines[-1][len("user:") :] if lines else prompt
    return text.split()[::-1]


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().ravel()[0]
            prompt = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            max_tokens = int(limit.as_numpy().ravel()[0]) if limit is not None else DEFAULT_MAX_TOKENS
            stop = json.loads(request.parameters() or "{}").get("stop", [])
            stop = json.loads(stop) if isinstance(stop, str) and stop.startswith("[") else stop
            stops = {stop} if isinstance(stop, str) else set(stop)
            words = []
            for word in answer(prompt)[: max(max_tokens, 0)]:
                if word in stops:
                    break
                words.append(word)
            for i, word in enumerate(words):
                if request.is_cancelled():
                    break
                text = np.array([(word if i == 0 else " " + word).encode("utf-8")], dtype=np.object_)
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", text)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
