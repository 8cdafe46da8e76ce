"""JSON schemas for kubeconform, generated offline: Kubernetes' swagger.json and CRDs, converted as
instrumenta/openapi2jsonschema does with ``--strict --stand-alone``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


def _k8s_fix(node: Any) -> Any:
    """Swagger 2 → JSON schema: int-or-string and quantities take both forms; objects are strict."""
    if isinstance(node, list):
        return [_k8s_fix(x) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("format") == "int-or-string":
        return {"oneOf": [{"type": "string"}, {"type": "integer"}], "description": node.get("description", "")}
    out = {k: _k8s_fix(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _refs(node: Any, acc: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            acc.add(ref.removeprefix("#/definitions/"))
        for v in node.values():
            _refs(v, acc)
    elif isinstance(node, list):
        for v in node:
            _refs(v, acc)


def write_k8s_schemas(swagger: dict, out: Path) -> int:
    """One standalone file per kind (``deployment-apps-v1.json``), with the definitions it uses."""
    defs = {name: _k8s_fix(d) for name, d in swagger["definitions"].items()}
    defs[_QUANTITY] = {"oneOf": [{"type": "string"}, {"type": "number"}], "description": "Kubernetes quantity"}
    defs[_INT_OR_STRING] = {"oneOf": [{"type": "string"}, {"type": "integer"}], "description": "int or string"}
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, d in defs.items():
        for gvk in swagger["definitions"][name].get("x-kubernetes-group-version-kind", []):
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            if kind.endswith("List") or kind in ("WatchEvent", "DeleteOptions", "Status", "APIVersions"):
                continue
            need: set[str] = set()
            _refs(d, need)
            todo = list(need)
            while todo:
                more: set[str] = set()
                _refs(defs[todo.pop()], more)
                for r in more - need:
                    need.add(r)
                    todo.append(r)
            schema = copy.deepcopy(d)
            props = schema.setdefault("properties", {})
            props["apiVersion"] = {"type": "string", "enum": [f"{group}/{version}" if group else version]}
            props["kind"] = {"type": "string", "enum": [kind]}
            schema["definitions"] = {r: defs[r] for r in sorted(need)}
            schema["$schema"] = "http://json-schema.org/schema#"
            suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
            (out / f"{kind.lower()}{suffix}.json").write_text(json.dumps(schema))
            written += 1
    return written


def _crd_fix(node: Any) -> Any:
    """CRD openAPIV3Schema → JSON schema: strict objects unless unknown fields are preserved."""
    if isinstance(node, list):
        return [_crd_fix(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _crd_fix(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out.pop("type", None)
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if node.get("x-kubernetes-embedded-resource"):
        out.setdefault("properties", {})
    return out


def write_crd_schemas(crds: list[dict], out: Path) -> int:
    """``<group>/<kind>_<version>.json`` per served version (the layout of Datree's CRDs-catalog)."""
    written = 0
    for crd in crds:
        spec = crd["spec"]
        for v in spec["versions"]:
            if not v.get("served", True):
                continue
            schema = _crd_fix(v["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            props["apiVersion"] = {"type": "string", "enum": [f"{spec['group']}/{v['name']}"]}
            props["kind"] = {"type": "string", "enum": [spec["names"]["kind"]]}
            props["metadata"] = {"type": "object"}
            schema["$schema"] = "http://json-schema.org/schema#"
            d = out / spec["group"]
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{spec['names']['kind'].lower()}_{v['name']}.json").write_text(json.dumps(schema))
            written += 1
    return written
