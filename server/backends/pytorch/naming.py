"""Triton's rules for binding config tensor names to a PyTorch module's arguments and results.

A TorchScript module has no tensor names, so Triton's PyTorch backend binds by convention:

inputs, in this order of preference
  1. every config input is an argument name of ``forward`` → bind by argument name;
  2. every config input is named ``<name>__<index>`` → bind to argument ``index`` (``INPUT__0``);
  3. otherwise → bind in config order (Triton logs a warning; so do we).
  A ``forward`` that takes a single ``Dict[str, Tensor]`` receives every input under its config name.

outputs
  1. every config output is named ``<name>__<index>`` → element ``index`` of the returned tuple/list;
  2. otherwise → config order.
  A returned ``Dict[str, Tensor]`` is read by config name (beyond Triton, for ``torch.export`` programs).

Pure functions: no torch import, so the rules are testable anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ...config import ConfigError

log = logging.getLogger(__name__)

FORWARD_ARGUMENT = "forward argument"
NAMED_INDEX = "<name>__<index>"
CONFIG_ORDER = "config order"
DICT_KEY = "dictionary key"


def named_index(name: str) -> int | None:
    """``index`` of ``<name>__<index>`` (Triton splits at the first ``__``), else None."""
    _, sep, rest = name.partition("__")
    if not sep or not rest or not rest.isdigit():
        return None
    return int(rest)


@dataclass(frozen=True)
class Binding:
    """Where each config tensor goes (inputs) or comes from (outputs)."""

    convention: str
    #: config name → position (argument index / result index); for DICT_KEY the config order
    positions: dict[str, int]

    def ordered(self) -> list[str]:
        """Config names sorted by position."""
        return sorted(self.positions, key=self.positions.__getitem__)


def check_declared(kind: str, names: Sequence[str]) -> None:
    """Triton's PyTorch backend needs every input and output in the config (no auto-complete)."""
    if not names:
        example = "INPUT__0, INPUT__1, ... or forward()'s argument names" if kind == "input" else "OUTPUT__0, ..."
        raise ConfigError(
            f"model configuration must contain at least one {kind}, none were specified. "
            f"The PyTorch backend does not auto-complete configs: list the {kind}s ({example})"
        )


def bind_inputs(model: str, names: Sequence[str], arguments: Sequence[str], dict_input: bool = False) -> Binding:
    """Bind config inputs ``names`` to ``forward``'s ``arguments`` (without ``self``)."""
    check_declared("input", names)
    if dict_input:
        return Binding(DICT_KEY, {n: i for i, n in enumerate(names)})
    if len(arguments) != len(names):
        raise ConfigError(
            f"unable to load model '{model}', configuration expects {len(names)} inputs, model provides "
            f"{len(arguments)}: forward({', '.join(arguments)})"
        )
    if all(n in arguments for n in names):
        return Binding(FORWARD_ARGUMENT, {n: list(arguments).index(n) for n in names})
    indices = {n: named_index(n) for n in names}
    if all(i is not None for i in indices.values()):
        positions = {n: int(i) for n, i in indices.items() if i is not None}
        _check_positions("input", positions, len(arguments), f"forward({', '.join(arguments)}) takes")
        return Binding(NAMED_INDEX, positions)
    log.warning(
        "input '%s' or previous input(s) are neither an input argument to the model '%s' nor do they follow "
        "the <name>__<index> naming convention. Falling back to enforcing strict ordering from model "
        "configuration.",
        next(n for n in names if n not in arguments and indices[n] is None),
        model,
    )
    return Binding(CONFIG_ORDER, {n: i for i, n in enumerate(names)})


def bind_outputs(model: str, names: Sequence[str], count: int | None = None) -> Binding:
    """Bind config outputs to result positions; ``count`` is the number of results when the module tells."""
    check_declared("output", names)
    indices = {n: named_index(n) for n in names}
    if all(i is not None for i in indices.values()):
        positions = {n: int(i) for n, i in indices.items() if i is not None}
        binding = Binding(NAMED_INDEX, positions)
    else:
        log.warning(
            "output '%s' or previous output(s) of the model '%s' do not follow the <name>__<index> naming "
            "convention. Falling back to enforcing strict ordering from model configuration.",
            next(n for n in names if indices[n] is None),
            model,
        )
        binding = Binding(CONFIG_ORDER, {n: i for i, n in enumerate(names)})
    if count is not None:
        _check_positions("output", binding.positions, count, "forward() returns")
    return binding


def _check_positions(kind: str, positions: dict[str, int], count: int, what: str) -> None:
    seen: dict[int, str] = {}
    for name, index in positions.items():
        if index >= count:
            raise ConfigError(
                f"{kind} '{name}' refers to {kind} index {index}, but {what} {count} {kind}"
                f"{'' if count == 1 else 's'}; indices start at 0"
            )
        if index in seen:
            raise ConfigError(f"{kind}s '{seen[index]}' and '{name}' both refer to {kind} index {index}")
        seen[index] = name
