"""Leader election on a coordination.k8s.io/v1 Lease, so several operator replicas can run safely.

Only the holder of the Lease runs kopf; the others wait. The holder renews the Lease every
``renew_seconds``; if it cannot renew within ``lease_seconds`` it stops (and its pod restarts as a
follower), so two writers never touch the repository at once for longer than one lease.
(kopf's own peering pauses *all* operators of equal priority, which a Deployment's replicas are.)
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("kubeinfer.operator.leader")


def _now() -> dt.datetime:
    """Lease times are MicroTime: the apiserver needs the six fraction digits isoformat drops at 0 µs."""
    t = dt.datetime.now(dt.timezone.utc)
    return t if t.microsecond else t.replace(microsecond=1)


class LeaseElector:
    def __init__(
        self,
        api: CoordinationV1Api,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_seconds: float = 5.0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds

    def try_acquire(self) -> bool:
        """Take or renew the Lease; False when another live holder has it (or we lost a race)."""
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
                self.api.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            return True
        spec = lease.spec or V1LeaseSpec()
        holder = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        duration = spec.lease_duration_seconds or self.lease_seconds
        expired = renewed is None or (_now() - renewed).total_seconds() > duration
        if holder and holder != self.identity and not expired:
            return False
        if holder == self.identity:
            lease.spec = self._spec(spec.lease_transitions or 0, spec.acquire_time or _now())
        else:
            lease.spec = self._spec((spec.lease_transitions or 0) + 1, _now())
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)  # resourceVersion: no races
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _spec(self, transitions: int, acquired: dt.datetime) -> V1LeaseSpec:
        return V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=self.lease_seconds,
            acquire_time=acquired,
            renew_time=_now(),
            lease_transitions=transitions,
        )

    def wait_for_leadership(self, stop: threading.Event) -> bool:
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire():
                    log.info("acquired lease %s/%s as %s", self.namespace, self.name, self.identity)
                    return True
            except ApiException as exc:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc.reason)
            if not announced:
                log.info("waiting for lease %s/%s (another operator leads)", self.namespace, self.name)
                announced = True
            stop.wait(self.renew_seconds)
        return False

    def keep_renewing(self, stop: threading.Event, lost: threading.Event) -> None:
        """Renew until ``stop``; on failure past the lease duration set ``lost`` and ``stop``."""
        last_ok = time.monotonic()
        while not stop.wait(self.renew_seconds):
            try:
                if self.try_acquire():
                    last_ok = time.monotonic()
                    continue
                log.error("lease %s/%s was taken over by another operator", self.namespace, self.name)
            except Exception as exc:  # keep trying until the lease would have expired
                log.warning("renewing lease %s/%s failed: %s", self.namespace, self.name, exc)
                # give up one renew period before the lease can expire for the others
                if time.monotonic() - last_ok < self.lease_seconds - self.renew_seconds:
                    continue
            lost.set()
            stop.set()
            return
