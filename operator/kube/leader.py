"""Leader election on a coordination.k8s.io/v1 Lease, so several operator replicas can run safely.

Only the holder of the Lease runs kopf; the others wait (kopf's own peering pauses *all* operators
of equal priority, which a Deployment's replicas are). The rules are client-go's
(``k8s.io/client-go/tools/leaderelection``):

* a lease held by another identity is valid while it keeps changing: a follower notes the *local*
  monotonic time at which it last saw the lease record change and treats the lease as expired only
  ``lease_seconds`` after that, so clock skew between nodes never shortens or lengthens a lease;
* the holder renews every ``renew_seconds`` and gives up (stops kopf, exits non-zero) when it has
  not renewed for ``renew_deadline`` seconds, which is shorter than the lease: by the time a
  follower may take over, the old leader has stopped writing;
* on a clean stop the holder releases the lease (empty holder, 1 s duration), so a follower takes
  over at once instead of waiting for the lease to expire.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("kubeinfer.operator.kube.leader")


def _now() -> dt.datetime:
    """Lease times are MicroTime: the apiserver needs the six fraction digits isoformat drops at 0 µs."""
    t = dt.datetime.now(dt.timezone.utc)
    return t if t.microsecond else t.replace(microsecond=1)


@dataclass(frozen=True)
class _Record:
    """The parts of a Lease whose change proves its holder is alive (client-go's LeaderElectionRecord)."""

    holder: str
    duration: int | None
    acquired: dt.datetime | None
    renewed: dt.datetime | None
    transitions: int

    @classmethod
    def of(cls, spec: V1LeaseSpec) -> _Record:
        return cls(
            spec.holder_identity or "",
            spec.lease_duration_seconds,
            spec.acquire_time,
            spec.renew_time,
            spec.lease_transitions or 0,
        )


class LeaseElector:
    def __init__(
        self,
        api: CoordinationV1Api,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
        renew_deadline: float = 10.0,
        retry_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_seconds < renew_deadline < lease_seconds:
            raise ValueError("need retry period < renew deadline < lease duration")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._observed: _Record | None = None
        self._observed_at = 0.0
        self.is_leader = False
        #: local time of the last attempt, successful or not (the follower's liveness looks at it)
        self.last_attempt = clock()

    # ------------------------------------------------------------------------------- the rules
    def observe(self, record: _Record) -> None:
        """Remember when ``record`` was first seen, by the local clock."""
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()

    def held_by_other(self, record: _Record) -> bool:
        """Another identity holds the lease and it has changed within the lease duration (local time)."""
        if not record.holder or record.holder == self.identity:
            return False
        return self.clock() < self._observed_at + self.lease_seconds

    def _spec(
        self, transitions: int, acquired: dt.datetime, holder: str | None = None, duration: int = 0
    ) -> V1LeaseSpec:
        return V1LeaseSpec(
            holder_identity=self.identity if holder is None else holder,
            lease_duration_seconds=duration or max(1, round(self.lease_seconds)),
            acquire_time=acquired,
            renew_time=_now(),
            lease_transitions=transitions,
        )

    # --------------------------------------------------------------------------------- API calls
    def try_acquire(self) -> bool:
        """Take or renew the Lease; False when another live holder has it (or we lost a race)."""
        self.last_attempt = self.clock()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = V1Lease(
                metadata=V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(transitions=0, acquired=_now()),
            )
            try:
                created = self.api.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            self.observe(_Record.of(created.spec or V1LeaseSpec()))
            self.is_leader = True
            return True
        spec = lease.spec or V1LeaseSpec()
        record = _Record.of(spec)
        self.observe(record)
        if self.held_by_other(record):
            self.is_leader = False
            return False
        if record.holder == self.identity:
            lease.spec = self._spec(record.transitions, record.acquired or _now())
        else:
            lease.spec = self._spec(record.transitions + 1, _now())
        try:
            # the read resourceVersion goes with the update: a concurrent writer makes this a 409
            updated = self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:
                self.is_leader = False
                return False
            raise
        self.observe(_Record.of(updated.spec or V1LeaseSpec()))
        self.is_leader = True
        return True

    def release(self) -> bool:
        """Give the lease up (client-go's ReleaseOnCancel): followers may take it at once."""
        if not self.is_leader:
            return False
        self.is_leader = False
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            spec = lease.spec or V1LeaseSpec()
            if spec.holder_identity != self.identity:
                return False
            lease.spec = self._spec(spec.lease_transitions or 0, _now(), holder="", duration=1)
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as exc:  # the lease then simply expires
            log.warning("releasing lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        log.info("released lease %s/%s", self.namespace, self.name)
        return True

    # -------------------------------------------------------------------------------------- loops
    def wait_for_leadership(self, stop: threading.Event) -> bool:
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire():
                    log.info("acquired lease %s/%s as %s", self.namespace, self.name, self.identity)
                    return True
            except Exception as exc:  # the API may be down for a while: keep following
                log.warning("lease %s/%s: %s", self.namespace, self.name, getattr(exc, "reason", None) or exc)
            if not announced:
                log.info("waiting for lease %s/%s (another operator leads)", self.namespace, self.name)
                announced = True
            stop.wait(self.retry_seconds)
        return False

    def keep_renewing(self, stop: threading.Event, lost: threading.Event) -> None:
        """Renew until ``stop``; when renewals fail for ``renew_deadline`` set ``lost`` and ``stop``."""
        last_ok = self.clock()
        while not stop.wait(self.retry_seconds):
            try:
                if self.try_acquire():
                    last_ok = self.clock()
                    continue
                if self._observed is not None and self._observed.holder not in ("", self.identity):
                    log.error("lease %s/%s was taken over by %s", self.namespace, self.name, self._observed.holder)
                    break
            except Exception as exc:  # keep trying until the renew deadline
                log.warning("renewing lease %s/%s failed: %s", self.namespace, self.name, exc)
            if self.clock() - last_ok < self.renew_deadline:
                continue
            log.error("could not renew lease %s/%s for %.0fs: stopping", self.namespace, self.name, self.renew_deadline)
            break
        else:
            return
        self.is_leader = False
        lost.set()
        stop.set()

    def healthy(self) -> bool:
        """For a follower's liveness probe: the election loop is still making attempts."""
        return self.clock() - self.last_attempt < max(3 * self.retry_seconds, 10.0)
