"""The operator's wings, bottom to top, as data: ``tests/unit/test_operator_wings.py`` holds the tree to it and
``docs/architecture.md`` describes it.

A module imports only from its own wing or from a floor below; wings on one floor do not import each other.
The modules at the top (``cli``, ``__main__``, ``liveness`` and this one) may import any wing. Each wing's
``__init__`` docstring says what it holds. From the server the operator imports only its bottom layer
(``kubeinfer.server.layers``'s operator rule).
"""

from __future__ import annotations

#: floors, bottom first; each a tuple of the wings on it
FLOORS: tuple[tuple[str, ...], ...] = (
    ("api",),
    ("kube", "sources"),
    ("volume", "replicas"),
    ("servers",),
    ("traffic",),
    ("models",),
    ("controllers",),
)
#: top-level modules above every wing
TOP = ("cli", "__main__", "liveness", "wings")


def floor_of(wing: str) -> int:
    """The floor of a wing (0 = bottom); KeyError for a name that is no wing."""
    for number, wings in enumerate(FLOORS):
        if wing in wings:
            return number
    raise KeyError(wing)
