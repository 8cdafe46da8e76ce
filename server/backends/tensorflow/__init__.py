"""TensorFlow backend: platforms ``tensorflow_savedmodel`` and ``tensorflow_graphdef`` / backend ``tensorflow``, as
Triton's TensorFlow backend.

Model: the SavedModel folder ``<version>/model.savedmodel/`` (or ``default_model_filename``), read through
the repository's descriptors (``model_files.pinned_tree``). The serving signature is ``serving_default``,
or ``parameters { key: "TF_SIGNATURE_DEF" ... }``, in the MetaGraphDef tagged ``serve`` (``TF_GRAPH_TAG``);
its keys are the config's input and output names. Auto-complete fills inputs, outputs, ``max_batch_size``
(the backend's default-max-batch-size when every signature tensor has a variable first dimension) and
dynamic batching from the signature (``savedmodel``, no load needed); the load checks the config against
it with Triton's messages.

GraphDef: the file ``<version>/model.graphdef`` (a binary ``GraphDef``, read through the repository's
descriptor, ``model_files.pinned``), imported into each session's graph (``graphdef``). Its ``Placeholder``
nodes are the possible inputs and its other nodes the possible outputs, by name; nothing is auto-completed
(as in Triton, its config lists inputs and outputs) and the load checks the config's names with Triton's
messages.

Each instance runs the model in a TensorFlow session (``tf.compat.v1.Session``, the C++ path Triton and
TensorFlow Serving use), one session per instance unless ``MAX_SESSION_SHARE_COUNT`` lets instances
share one; ``Session.run`` releases the GIL, so instances execute in parallel. Types: BOOL, UINT8/16/32/64,
INT8/16/32/64, FP16, FP32, FP64, STRING, and (beyond Triton) BF16. Parameters: ``parameters``.
``tensorflow`` is imported only when such a model loads: without it (``pip install kubeinfer[tensorflow]``)
that model is UNAVAILABLE with the reason and the server serves the rest.
"""

from .backend import INSTALL_HINT, TensorFlowBackend, require_tensorflow

__all__ = ["INSTALL_HINT", "TensorFlowBackend", "require_tensorflow"]
