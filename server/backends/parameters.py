"""Reading Triton's string-valued ``config.pbtxt`` ``parameters``: one parser and one error text for every backend.

Triton's backends keep every parameter as a string (``parameters { key: "X" value { string_value: "1" } }``)
and parse booleans and counts from it themselves; here the backends that read them (PyTorch, TensorFlow)
share the parsing, so the same mistake gets the same words whichever backend reads it. Which keys a
backend reads, and their defaults, stay with the backend (``pytorch.parameters``, ``tensorflow.parameters``).
"""

from __future__ import annotations

from ..config import ConfigError, pb

#: the spellings accepted for a boolean (Triton's ``ParseBoolValue``: true/on/1, false/off/0; yes/no too)
TRUE = frozenset({"true", "1", "on", "yes"})
FALSE = frozenset({"false", "0", "off", "no"})


def string_parameter(config: pb.ModelConfig, key: str) -> str | None:
    """The parameter's value without surrounding blanks; None when the config does not set it or sets it empty
    (as the ONNX Runtime backend has always read its parameters)."""
    p = config.parameters.get(key)
    value = None if p is None else p.string_value.strip()
    return value or None


def to_bool(raw: str, what: str) -> bool:
    """``raw`` as a boolean; ``what`` names the setting in the error (``parameter 'X'``, a backend-config flag)."""
    low = raw.strip().lower()
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    raise ConfigError(f"{what} must be true or false, got '{raw}'")


def bool_parameter(config: pb.ModelConfig, key: str) -> bool | None:
    """A boolean parameter; None when unset."""
    raw = string_parameter(config, key)
    return None if raw is None else to_bool(raw, f"parameter '{key}'")


def count_parameter(config: pb.ModelConfig, key: str, *, minimum: int, backend: str) -> int | None:
    """An integer parameter of at least ``minimum`` (0 or 1); None when unset. The error is Triton's text
    (tensorflow.cc ``ModelState::ParseParameters``), with ``backend`` naming the backend as Triton's does."""
    raw = string_parameter(config, key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        rule = "non-negative" if minimum == 0 else "positive"
        raise ConfigError(f"parameter '{key}' must be {rule} number for {backend} model '{config.name}'")
    return value
