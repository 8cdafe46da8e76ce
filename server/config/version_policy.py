"""Which versions a ``version_policy`` selects: one function for the server and the operator.

Triton's rule (``VersionsToLoad`` in triton-inference-server/core ``src/model_lifecycle.cc``): no policy
means ``latest { num_versions: 1 }``; ``latest`` walks the existing versions from the highest down and
stops once it holds ``num_versions``, so ``latest { num_versions: 0 }`` selects nothing (Triton then
refuses the load: "at least one version must be available under the version policy of model '<name>'");
``specific`` keeps the listed versions that exist (it logs the missing ones); ``all`` keeps every one.
Here ``validate_config`` already refuses ``num_versions: 0`` with its own message before any selection,
and this function still gives Triton's answer (nothing) for callers that did not validate.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import model_config_pb2 as pb

#: versions ``latest`` serves when the config has no ``version_policy`` (Triton's ``latest { num_versions: 1 }``)
DEFAULT_NUM_VERSIONS = 1
#: fewest versions a ``latest`` policy may ask for (Triton refuses a load with none)
MIN_NUM_VERSIONS = 1


def select_versions(config: pb.ModelConfig, available: Iterable[int]) -> list[int]:
    """The versions among ``available`` that ``config.version_policy`` selects, ascending."""
    versions = sorted(set(available))
    policy = config.version_policy
    if policy.HasField("all"):
        return versions
    if policy.HasField("specific"):
        return sorted(set(policy.specific.versions) & set(versions))
    n = policy.latest.num_versions if policy.HasField("latest") else DEFAULT_NUM_VERSIONS
    return versions[max(len(versions) - n, 0) :] if n > 0 else []
