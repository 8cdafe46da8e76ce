"""The e2e tests' reading of operator logs: transient retries pass, refusals and give-ups do not."""

from tests.support.operator_logs import is_transient_retry, problems, without_terminating_namespaces

RETRY_429 = (
    "2026-12-01 11:23:14,968 ERROR kopf._cogs.clients.watching: Request attempt #1/9 failed; will retry: "
    "GET https://h/apis/x -> APITooManyRequestsError('storage is (re)initializing', {...}, status=429)"
)
RETRY_403 = (
    "2026-12-01 11:23:14,968 ERROR kopf._cogs.clients.watching: Request attempt #1/9 failed; will retry: "
    "GET https://h/apis/x -> APIForbiddenError('forbidden', {...}, status=403)"
)
GAVE_UP = (
    "2026-12-01 11:23:24,968 ERROR kopf._cogs.clients.watching: Request attempt #9/9 failed; giving up: "
    "GET https://h/apis/x -> APITooManyRequestsError('storage is (re)initializing', {...}, status=429)"
)
HANDLER = "2026-12-01 11:23:15,080 ERROR kopf.objects: Handler 'server-create' failed with an exception."


def test_a_transient_retry_is_not_a_problem_but_a_refusal_or_a_give_up_is() -> None:
    assert is_transient_retry(RETRY_429)
    assert not is_transient_retry(RETRY_403)
    assert not is_transient_retry(GAVE_UP)
    text = "\n".join([RETRY_429, "2026-12-01 11:23:15 INFO kopf.objects: fine", RETRY_403, GAVE_UP, HANDLER])
    assert problems(text) == [RETRY_403, GAVE_UP, HANDLER]


def test_levels_choose_what_counts() -> None:
    warn = "2026-12-01 11:23:15,080 WARNING kopf.objects: Patching failed with inconsistencies"
    assert problems(warn) == []
    assert problems(warn, ("ERROR", "WARNING")) == [warn]


def test_a_refusal_in_a_namespace_being_deleted_goes_with_its_traceback_and_nothing_else() -> None:
    terminating = "\n".join(
        [
            "2026-12-03 11:19:37,101 ERROR kopf.objects: Handler 'server-update' failed with an exception. Will retry.",
            "Traceback (most recent call last):",
            "kubernetes.client.exceptions.ForbiddenException: (403)",
            "Reason: Forbidden",
            'HTTP response body: {"message":"persistentvolumeclaims \\"r\\" is forbidden: unable to create new '
            'content in namespace t-1 because it is being terminated","details":{"causes":[{"reason":'
            '"NamespaceTerminating"}]},"code":403}',
        ]
    )
    rbac = (
        '2026-12-03 11:19:38,000 ERROR kopf.objects: deployments.apps "pool" is forbidden: User "system:'
        'serviceaccount:ops:op" cannot patch resource "deployments"'
    )
    fine = "2026-12-03 11:19:39,535 INFO kopf.objects: Handler 'server-update' succeeded."
    assert without_terminating_namespaces("\n".join([terminating, rbac, fine])) == "\n".join([rbac, fine])
    assert problems(without_terminating_namespaces(terminating)) == []
