"""Facts of the InferenceModel spec that its typed classes (``model_types``) state and the feature modules
(``traffic.rollout``) read: the rollout rule's defaults, the schemes a source's uri takes."""

from __future__ import annotations

#: spec.rollout.windowSeconds when unset
ROLLOUT_WINDOW_SECONDS = 60
#: spec.rollout.minRequests when unset
ROLLOUT_MIN_REQUESTS = 100
#: the schemes ``source.uri`` takes (the apiserver's message quotes this pattern)
SOURCE_URI_PATTERN = "^(https?|s3|gs|oci|hf|az)://"
