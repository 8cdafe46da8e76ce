"""Which failed event posts are worth a log line: a namespace being deleted is not one."""

from __future__ import annotations

import json

from kubeinfer.operator.kube.events import namespace_terminating
from kubernetes.client.exceptions import ApiException


def _refused(status: int, body: dict) -> ApiException:
    exc = ApiException(status=status, reason="Forbidden")
    exc.body = json.dumps(body)
    return exc


def test_a_terminating_namespace_is_told_apart_from_a_missing_right() -> None:
    # the API server's answer to a create in a namespace being deleted (k8s NamespaceLifecycle admission)
    terminating = _refused(
        403,
        {
            "kind": "Status",
            "status": "Failure",
            "message": 'events "m.1" is forbidden: unable to create new content in namespace t-1 because it is '
            "being terminated",
            "reason": "Forbidden",
            "details": {
                "kind": "events",
                "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}],
            },
            "code": 403,
        },
    )
    rbac = _refused(
        403,
        {
            "kind": "Status",
            "message": 'events is forbidden: User "system:serviceaccount:ops:op" cannot create resource "events"',
            "reason": "Forbidden",
            "code": 403,
        },
    )
    assert namespace_terminating(terminating)
    assert not namespace_terminating(rbac)
    assert not namespace_terminating(_refused(409, {"reason": "AlreadyExists"}))
    assert not namespace_terminating(RuntimeError("connection refused"))
