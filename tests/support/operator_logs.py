"""Reading an operator's log in tests: what counts as a problem.

kopf logs each retried API request at ERROR ("Request attempt #1/9 failed; will retry: ...") even when
the retry succeeds. A transient answer (429 "storage is (re)initializing" right after CRDs register,
a 5xx, a dropped connection) followed by a retry is the apiserver's business, not a defect of ours;
a refusal (401/403/404/422) is one, retried or not, and so is a retry that runs out.
"""

from __future__ import annotations

import re

#: kopf's line for a request it will try again, and the transient causes we accept there
_RETRY = re.compile(r"Request attempt #\d+/\d+ failed; will retry")
_TRANSIENT = re.compile(
    r"status=(429|500|502|503|504)\)|APITooManyRequestsError|APIServerError|"
    r"ClientConnectionError|ServerDisconnectedError|ClientOSError|TimeoutError"
)


def is_transient_retry(line: str) -> bool:
    """A line about a request kopf retries after an answer that is expected to pass."""
    return bool(_RETRY.search(line) and _TRANSIENT.search(line))


def problems(text: str, levels: tuple[str, ...] = ("ERROR",)) -> list[str]:
    """The lines at any of ``levels`` (e.g. ERROR, WARNING) that are not transient retries."""
    marks = tuple(f" {level} " for level in levels)
    return [line for line in text.splitlines() if any(mark in line for mark in marks) and not is_transient_retry(line)]
