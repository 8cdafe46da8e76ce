"""Reading an operator's log in tests: what counts as a problem.

kopf logs each retried API request at ERROR ("Request attempt #1/9 failed; will retry: ...") even when
the retry succeeds. A transient answer (429 "storage is (re)initializing" right after CRDs register,
a 5xx, a dropped connection) followed by a retry is the apiserver's business, not a defect of ours;
a refusal (401/403/404/422) is one, retried or not, and so is a retry that runs out -- except the API
server's refusal to create anything in a namespace being deleted (403, cause NamespaceTerminating): a
cluster-wide operator meets it whenever another test's namespace goes away, and no right can change it.
"""

from __future__ import annotations

import re

#: kopf's line for a request it will try again, and the transient causes we accept there
_RETRY = re.compile(r"Request attempt #\d+/\d+ failed; will retry")
_TRANSIENT = re.compile(
    r"status=(429|500|502|503|504)\)|APITooManyRequestsError|APIServerError|"
    r"ClientConnectionError|ServerDisconnectedError|ClientOSError|TimeoutError"
)


#: the first line of a log record (the operator's format: "2026-12-03 11:19:39,535 INFO logger: message")
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_TERMINATING = re.compile(r"NamespaceTerminating|because it is being terminated")


def without_terminating_namespaces(text: str) -> str:
    """``text`` less each record (a line and its traceback) about a namespace being deleted."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if _RECORD.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    return "\n".join("\n".join(r) for r in records if not any(_TERMINATING.search(line) for line in r))


def is_transient_retry(line: str) -> bool:
    """A line about a request kopf retries after an answer that is expected to pass."""
    return bool(_RETRY.search(line) and _TRANSIENT.search(line))


def problems(text: str, levels: tuple[str, ...] = ("ERROR",)) -> list[str]:
    """The lines at any of ``levels`` (e.g. ERROR, WARNING) that are not transient retries."""
    marks = tuple(f" {level} " for level in levels)
    return [line for line in text.splitlines() if any(mark in line for mark in marks) and not is_transient_retry(line)]
