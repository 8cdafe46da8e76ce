"""Which server images an operator runs: ``--server-image-prefix``, matched on image-reference boundaries.

A plain string prefix let ``registry.example.com/ml`` admit ``registry.example.com/ml-untrusted/x`` and
``registry.example.com.attacker.io/x``. Here a prefix admits an image only where the reference's own
structure continues after it: the prefix is the whole repository, or the image goes on with ``/`` (a path
below it), ``:`` (a tag) or ``@`` (a digest), or the prefix itself ends with one of those. Both sides are
compared in their full form, as the container runtime pulls them (``nginx`` is
``docker.io/library/nginx``), so a short name cannot slip past a prefix written in full or the reverse.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_REGISTRY = "docker.io"
BOUNDARIES = "/:@"


def full_reference(image: str) -> str:
    """``image`` with the registry and Docker Hub's ``library/`` made explicit, as the runtime resolves it."""
    first, slash, rest = image.partition("/")
    if not slash:
        return f"{DEFAULT_REGISTRY}/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"{DEFAULT_REGISTRY}/{image}"


def full_prefix(prefix: str) -> str:
    """A prefix in full form; a bare registry host (``registry.example.com``, ``localhost:5000``) is that whole
    registry."""
    if "/" not in prefix and ("." in prefix or ":" in prefix or prefix == "localhost"):
        return prefix + "/"
    return full_reference(prefix)


def allowed(image: str, prefixes: Iterable[str]) -> bool:
    """Whether ``image`` is one of ``prefixes``' images (no prefixes: any image)."""
    listed = [p for p in prefixes if p]
    if not listed:
        return True
    if not image or any(c.isspace() for c in image):
        return False
    ref = full_reference(image)
    for prefix in listed:
        want = full_prefix(prefix)
        if ref == want:
            return True
        if ref.startswith(want) and (want[-1] in BOUNDARIES or ref[len(want)] in BOUNDARIES):
            return True
    return False
