"""The OpenAI-compatible front end (``--openai-port``, off by default), as Triton's ``python/openai`` frontend.

``GET /v1/models``, ``POST /v1/chat/completions`` and ``/v1/completions`` (``stream: true`` as server-sent
events) for models that follow the generate-extension conventions, ``POST /v1/embeddings`` for models that
take text and return vectors. It translates OpenAI's JSON to ``InferenceRequest`` objects and calls
``runtime.service`` like the HTTP and gRPC front ends (layer 5): see ``app.py`` for the mapping.
"""

from __future__ import annotations

from .app import build_openai_app

__all__ = ["build_openai_app"]
