"""Typed spec classes: a frozen dataclass whose fields also state their JSON name, description, bounds and
default (``spec_field``), so that one class is the home of a CRD's spec schema (``schema_of``) and of the typed
object the reconcilers read (``parse``; ``as_body`` writes it back). What a field cannot say as a type goes
into its metadata as schema keywords (bounds, patterns, CEL rules), attached where the schema has them.

Types map to the OpenAPI schema as follows: ``int`` is an int32 integer (``format="int64"`` to widen), ``str``
a string, ``bool`` a boolean, ``float`` a number, ``Literal[...]`` a string enum, ``Quantity`` an int-or-string,
``tuple[X, ...]`` an array of X, ``Mapping[str, X]`` an object of X values (``Mapping[str, Any]``: an object
passed through unchanged), a dataclass an object of its fields; ``X | None`` is X, unset.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeAlias, TypeVar, Union

_INT_OR_STRING = "int-or-string"
#: a Kubernetes quantity (``16Gi``, ``1``): an int-or-string in the schema
Quantity: TypeAlias = Annotated[int | str, _INT_OR_STRING]
QUANTITY_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
}

_META = "kubeinfer.api"
#: where each schema keyword goes in a generated schema (keywords not named here: after the description, in the
#: order the field states them); the CRD YAML is written in this order
_RANK = {
    "x-kubernetes-int-or-string": 0,
    "anyOf": 1,
    "type": 2,
    "format": 3,
    "description": 4,
    "required": 6,
    "properties": 7,
    "items": 8,
    "additionalProperties": 9,
    "x-kubernetes-preserve-unknown-fields": 10,
    "x-kubernetes-list-type": 11,
    "x-kubernetes-validations": 12,
}


class SpecClass(Protocol):
    """A frozen dataclass of ``spec_field``s. Class-level facts of its object schema: ``VALIDATIONS`` (CEL rules
    over its fields), ``DESCRIPTION`` (where no field describes it: the top of a spec) and ``SCHEMA_KEY_ORDER``."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


T = TypeVar("T", bound=SpecClass)


@dataclasses.dataclass(frozen=True)
class ApiField:
    json: str
    description: str
    required: bool
    #: schema keywords of the field's own schema, in the order written (after the description)
    extra: Mapping[str, Any]
    #: schema keywords of an array's items
    items: Mapping[str, Any]
    validations: Sequence[Mapping[str, str]]
    #: write the default into the schema (the apiserver then applies it too)
    emit_default: bool
    #: keys written first, in this order, before the rest in their usual order
    key_order: tuple[str, ...]
    #: a nested class's defaults that depend on where it is used (by JSON name); its descriptions may name
    #: them as ``{jsonName}``
    nested_defaults: Mapping[str, Any] | None
    #: the field's whole schema, written as given (a schema several CRDs share: the conditions)
    schema: Mapping[str, Any] | None = None


def spec_field(
    json: str,
    description: str = "",
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | None = None,
    required: bool = False,
    emit_default: bool = False,
    items: Mapping[str, Any] | None = None,
    validations: Sequence[Mapping[str, str]] = (),
    key_order: tuple[str, ...] = (),
    nested_defaults: Mapping[str, Any] | None = None,
    list_type: str | None = None,
    schema: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Any:
    """A dataclass field with its API facts; ``extra`` are schema keywords (``minimum=1``, ``pattern=...``),
    ``list_type`` an array's ``x-kubernetes-list-type``, ``schema`` a whole schema to write as it is."""
    if list_type is not None:
        extra["x-kubernetes-list-type"] = list_type
    meta = ApiField(
        json, description, required, extra, items or {}, validations, emit_default, key_order, nested_defaults, schema
    )
    metadata = {_META: meta}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def api_field(f: dataclasses.Field[Any]) -> ApiField:
    meta = f.metadata[_META]
    assert isinstance(meta, ApiField)
    return meta


#: each spec class's field types, resolved once (``resolve``)
_HINTS: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def _classes_in(tp: Any) -> list[type]:
    tp = _unwrap_optional(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    return [c for arg in typing.get_args(tp) for c in _classes_in(arg)]


def resolve(cls: type) -> None:
    """Resolve the field types of ``cls`` and of the classes it holds now, once: a class keeps the classes it
    was defined with even when its module is executed again (``importlib.reload``), which makes new ones."""
    for tp in _hints(cls).values():
        for inner in _classes_in(tp):
            resolve(inner)


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _is_quantity(tp: Any) -> bool:
    return typing.get_origin(tp) is Annotated and _INT_OR_STRING in tp.__metadata__


def _ordered(schema: dict[str, Any], first: Sequence[str] = ()) -> dict[str, Any]:
    keys = sorted(schema, key=lambda k: _RANK.get(k, 5))
    keys = [k for k in first if k in schema] + [k for k in keys if k not in first]
    return {k: schema[k] for k in keys}


def _type_schema(tp: Any, fmt: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The schema of a type, without description (the field that uses it describes it)."""
    tp = _unwrap_optional(tp)
    if _is_quantity(tp):
        return dict(QUANTITY_SCHEMA)
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        assert isinstance(tp, type)
        return _object_schema(tp, fmt)
    if origin is Literal:
        return {"type": "string", "enum": list(typing.get_args(tp))}
    if origin is tuple:
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0])}
    if origin in (Mapping, dict):
        value = typing.get_args(tp)[1]
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": _type_schema(value)}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "format": "int32"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    raise TypeError(f"no schema for {tp!r}")


def _object_schema(cls: type, fmt: Mapping[str, Any] | None = None) -> dict[str, Any]:
    hints = _hints(cls)
    fields = dataclasses.fields(cls)
    schema: dict[str, Any] = {"type": "object"}
    description = getattr(cls, "DESCRIPTION", None)
    if description:
        schema["description"] = description
    required = [api_field(f).json for f in fields if api_field(f).required]
    if required:
        schema["required"] = required
    schema["properties"] = {api_field(f).json: field_schema(f, hints[f.name], fmt) for f in fields}
    validations = getattr(cls, "VALIDATIONS", ())
    if validations:
        schema["x-kubernetes-validations"] = [dict(v) for v in validations]
    return _ordered(schema, getattr(cls, "SCHEMA_KEY_ORDER", ()))


def field_schema(f: dataclasses.Field[Any], tp: Any, fmt: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One field's schema: its type's, described, with the keywords and rules the field states."""
    meta = api_field(f)
    if meta.schema is not None:
        return dict(meta.schema)
    schema = _type_schema(tp, meta.nested_defaults)
    if meta.description:
        schema["description"] = meta.description.format_map(fmt) if fmt else meta.description
    schema.update(meta.extra)
    if meta.emit_default:
        schema["default"] = f.default
    if meta.items:
        schema["items"] = {**schema["items"], **meta.items}
    if meta.validations:
        schema["x-kubernetes-validations"] = [dict(v) for v in meta.validations]
    return _ordered(schema, meta.key_order)


def schema_of(cls: type[SpecClass]) -> dict[str, Any]:
    """The OpenAPI v3 schema of a spec class (a CRD's ``spec``)."""
    return _object_schema(cls)


def _convert(tp: Any, value: Any, meta: ApiField | None) -> Any:
    tp = _unwrap_optional(tp)
    if _is_quantity(tp):
        return value
    if dataclasses.is_dataclass(tp):
        assert isinstance(tp, type)
        return parse(tp, value, meta.nested_defaults if meta else None)
    origin = typing.get_origin(tp)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return tuple(_convert(item, v, None) for v in value)
    if origin in (Mapping, dict):
        return dict(value)
    if tp is float:
        return float(value)
    return value


def parse(cls: type[T], data: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None) -> T:
    """``data`` (a custom object's spec, or a part of it) as ``cls``: the fields it leaves out get their defaults
    (``defaults``, by JSON name, before the class's own); keys the class does not know are ignored (the apiserver
    prunes them already)."""
    data = data or {}
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        meta = api_field(f)
        value = data.get(meta.json)
        if value is not None:
            kwargs[f.name] = _convert(hints[f.name], value, meta)
        elif defaults and meta.json in defaults:
            kwargs[f.name] = defaults[meta.json]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{cls.__name__}: {meta.json} is required")
    return cls(**kwargs)


#: how ``as_body`` writes a field's value, chosen once per class from the field's type (None: as it is)
_Write: TypeAlias = Callable[[Any], Any] | None


@dataclasses.dataclass(frozen=True)
class _BodyFields:
    """A class's fields as ``as_body`` writes them: their JSON names, their values (one call for all), and the
    writers of those whose values are not written as they are."""

    names: tuple[str, ...]
    values: Callable[[Any], tuple[Any, ...]]
    written: tuple[tuple[str, Callable[[Any], Any]], ...]


#: each class's ``_BodyFields``, built once: ``as_body`` runs per status write
_BODY_FIELDS: weakref.WeakKeyDictionary[type, _BodyFields] = weakref.WeakKeyDictionary()
_PLAIN_TYPES = (bool, int, float, str)


def _is_plain(tp: Any) -> bool:
    return tp in _PLAIN_TYPES or typing.get_origin(tp) is Literal or _is_quantity(tp)


def _nested_body(value: Any) -> Any:
    return as_body(value)


def _list_of(write: _Write) -> Callable[[Any], Any]:
    if write is None:
        return list
    item_write = write
    return lambda value: [item_write(v) for v in value]


def _writer(tp: Any) -> _Write:
    """How a value of type ``tp`` is written: as it is (a scalar), as a body (a dataclass), a list (a tuple),
    a dict (a mapping); anything else as ``_body_value`` finds it."""
    tp = _unwrap_optional(tp)
    if _is_plain(tp):
        return None
    if dataclasses.is_dataclass(tp):
        return _nested_body
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return _list_of(_writer(args[0]))
    if origin in (Mapping, dict):
        return dict
    return _body_value


def _values(names: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    """An object's values of ``names`` as a tuple, in one call."""
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda obj: (one(obj),)
    if not names:
        return lambda obj: ()
    return operator.attrgetter(*names)


def _body_fields(cls: type) -> _BodyFields:
    fields = _BODY_FIELDS.get(cls)
    if fields is None:
        hints = _hints(cls)
        written = [(api_field(f).json, _writer(hints[f.name])) for f in dataclasses.fields(cls)]
        fields = _BodyFields(
            tuple(json for json, _ in written),
            _values([f.name for f in dataclasses.fields(cls)]),
            tuple((json, write) for json, write in written if write is not None),
        )
        _BODY_FIELDS[cls] = fields
    return fields


def _body_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_body(value)
    if isinstance(value, tuple):
        return [_body_value(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value


def as_body(obj: Any, *, nulls: bool = False) -> dict[str, Any]:
    """A typed object back as the custom object's JSON: every field that has a value (defaults included);
    ``nulls``: its unset fields too, as null (a merge patch of a status: null removes what an earlier one set).
    Nested objects are written without their unset fields. Each field is written as its type says (the
    writers are built once per class: a status write per model calls this)."""
    fields = _body_fields(obj.__class__)
    pairs = zip(fields.names, fields.values(obj), strict=True)
    body = dict(pairs) if nulls else {json: value for json, value in pairs if value is not None}
    for json, write in fields.written:  # in place: the keys keep the fields' order
        value = body.get(json)
        if value is not None:
            body[json] = write(value)
    return body
