"""The InferenceModel controller: render the model into its pool's folder, read every replica's index, write
the status (only when it changed), and recheck it within seconds until Ready; when the model is deleted,
remove its folder and wait until no replica has it loaded.

One reconcile runs as named steps over a ``_ModelPass``: find the server; bring the folder up to date (or
see from the render memo that it is, ``render_memo.py``); read the replicas; build the status (cold start,
rollout decision, sequence routing); publish it. A failed render waits out its backoff (``failures.py``).
The object is parsed once per reconcile (``InferenceModel.from_body``, and its server's spec): the steps and the
modules they call read typed attributes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kopf
from kubeinfer.server.config import ConfigError
from kubeinfer.server.config.platforms import backend_for
from kubeinfer.server.config.version_policy import select_versions
from kubeinfer.server.repository.layout import config_digest
from kubernetes.client.exceptions import ApiException

from ..api import status
from ..api.model_types import InferenceModel
from ..api.pool_defaults import CODE_BACKENDS, allowed_backends
from ..api.server_types import InferenceServerSpec
from ..kube.client import MODELS
from ..models import cold_start
from ..models.failures import TEMPORARY_REASONS, retry_delay
from ..models.recheck import DELAYS, Rechecker
from ..models.render import DEFAULT_BACKENDS, render_versions
from ..models.render_memo import RenderMemo, server_key
from ..models.superseded import superseded
from ..replicas.indexes import Endpoint
from ..replicas.nudge import Nudger
from ..replicas.server_access import PLAIN, ServerAccess
from ..servers import manifests
from ..sources.artifacts import ArtifactError
from ..sources.credentials import credential_data
from ..sources.fetch import Fetch
from ..traffic import sequence_routing
from ..traffic.autoscaling import scales_to_zero
from ..traffic.rollout import Rollouts, weights_in_force
from ..volume.rendered import RenderedModel
from ..volume.repository_writer import SyncResult
from .model_record import ModelRecord
from .reconcile_parts import RECHECK_THREADS, ReconcileParts, log

#: backends whose models are code run by the server
#: Ready reasons worth a quick recheck after a change (the server has yet to pick it up)
SETTLING = {"Loading", "ServerUnreachable", "ServerNotReady", "ServerUnavailable"}
#: seconds a render's status write waits for the replicas' answer to its poll request (Rendered and Ready in
#: one write) before it is written anyway
NUDGE_STATUS_WAIT = 2.0
#: seconds after a render during which its rechecks take the folder as the render left it: the whole series
#: of rechecks (recheck.DELAYS) after the status write's wait for the replicas
RECHECK_TRUST = NUDGE_STATUS_WAIT + sum(DELAYS)
#: the reason a deleted model's finalizer waits: a server still has it loaded (a retry by design, logged at INFO)
UNLOAD_WAIT = "waiting for the server to unload"
#: seconds a deleted model's finalizer waits for the servers' answer to the poll request that unloads it
NUDGE_WAIT = 10.0
#: reconcile_model(render=False) of a model that needs a render
NEEDS_RENDER: dict[str, Any] = {}


@dataclass
class _ModelPass:
    """One reconcile of one model: what its steps found and did."""

    model: InferenceModel
    #: the model's record, taken when the reconcile started (``ModelRecords.of``)
    record: ModelRecord
    #: the InferenceServer the model names (None: it does not exist), and its spec (typed once, here)
    server: dict[str, Any] | None
    server_spec: InferenceServerSpec | None
    obs: status.ModelObservation
    #: a resync (or recheck), not a change
    from_timer: bool
    #: the render changed the folder; the replicas were asked to poll it now
    changed: bool = False
    nudged: bool = False
    #: what the render changed in the folder (the Rendered event's message), None when it changed nothing
    rendered_note: str | None = None
    #: a temporary failure's message and the delay before the work queue tries again
    temporary: str | None = None
    delay: float = 0.0
    endpoints: list[Endpoint] = field(default_factory=list)
    access: ServerAccess | str = PLAIN
    #: a render this many seconds old or younger is taken as it left the folder (``reconcile_model``'s ``trust``)
    trust: float = 0.0

    def __post_init__(self) -> None:
        model = self.model
        self.ns, self.name, self.uid, self.generation = model.namespace, model.name, model.uid, model.generation
        self.server_name: str = model.spec.server
        self.prev: Mapping[str, Any] = model.status

    @property
    def cancelled(self) -> bool:
        """The render gave up: the object is going away (or changed) meanwhile."""
        return (self.obs.render_error or ("",))[0] == "Cancelled"


class ModelController:
    """Reconciles InferenceModels (and removes a deleted one's folder) with the collaborators it is handed
    (``parts``); what it keeps about each model is in the model's record (``parts.records``)."""

    def __init__(self, parts: ReconcileParts) -> None:
        self.parts = parts
        config = self.config = parts.config
        self.kube, self.lookup, self.reader, self.access = parts.kube, parts.lookup, parts.reader, parts.access
        self.writer, self.gate, self.quota = parts.writer, parts.gate, parts.quota
        self.records, self.models = parts.records, parts.models
        self.rechecker = Rechecker(self._recheck, threads=RECHECK_THREADS)
        self.nudger = Nudger(self.reader.client_for, self._nudged, full=max(2, config.workers))
        #: (replica URL, model name) -> recheck key of the model, while a poll request for it is on its way
        self._nudged_keys: dict[tuple[str, str], tuple[str, str, str]] = {}
        #: weights between versions: numbers per version, spec.rollout's decisions (operator/traffic/rollout.py);
        #: each model's window is in its record
        self.rollouts = Rollouts(self.reader)

    def reconcile_model(
        self,
        body: Mapping[str, Any],
        retry: int = 0,
        from_timer: bool = False,
        cancelled: Callable[[], bool] | None = None,
        max_age: float | None = None,
        recheck: bool = True,
        render: bool = True,
        trust: float = 0.0,
    ) -> dict[str, Any] | None:
        """Render, sync the repository, read every replica's index, write status (if it changed).

        A failed render is not repeated by the resync for the same generation until its backoff expires
        (a bad checksum would otherwise re-download the file every resync); changes and retries always
        render. A resync (``from_timer``) of a model whose generation, server and folder are as its last
        render left them renders nothing; with ``render`` False it returns ``NEEDS_RENDER`` instead of
        rendering (the resync pass hands such models to the work queue). After a change the model is
        rechecked within seconds until Ready (``recheck``); those rechecks only read the replicas: a render
        up to ``trust`` seconds old is taken as it left the folder, without looking at the claim and the
        folder again (the resync does). Returns the status (None: skipped, cancelled).
        """
        # a resync of an object whose change is still rendering (a slow download) does not wait for it:
        # waiting would hold a second thread for as long as the download runs
        # the record is taken once: a DELETED event during the reconcile forgets it, and what the steps still
        # write goes to this object, which goes with it, instead of making the model a new record
        record = self.records.of(body["metadata"]["uid"])
        with _held(record.lock, wait=not from_timer) as got:
            if not got:
                return None
            run = self._find_server(body, from_timer, record)
            run.trust = trust
            if run.server is not None:
                if not self._update_folder(run, retry, cancelled, render):
                    return None if run.cancelled else NEEDS_RENDER  # cancelled: going away, nothing to report
                self._read_replicas(run, max_age)
            new, decided = self._model_status(run)
            return self._publish(run, new, decided, recheck)

    def lock(self, uid: str) -> threading.Lock:
        """The model's lock: held by whoever writes for it (a reconcile, its deletion)."""
        return self.records.of(uid).lock

    def forget(self, uid: str) -> None:
        """The model is gone: its record goes, and with it all this process kept of it (one removal)."""
        self.records.forget(uid)

    def close(self) -> None:
        """Stop the rechecks and the poll requests."""
        self.rechecker.stop()
        self.nudger.close()

    # ------------------------------------------------------------------------- the reconcile's steps
    def _find_server(self, body: Mapping[str, Any], from_timer: bool, record: ModelRecord) -> _ModelPass:
        """The pass, with the model's InferenceServer (kopf's index: no API call), or the error that it is missing."""
        model = InferenceModel.from_body(body)
        obs = status.ModelObservation(generation=model.generation, target=[], rendered=[], server=model.spec.server)
        server = self.lookup.server(model.namespace, model.spec.server)
        server_spec = None if server is None else InferenceServerSpec.from_body(server)
        run = _ModelPass(model, record, server, server_spec, obs, from_timer)
        if run.server_spec is None:
            obs.render_error = (
                "ServerNotFound",
                f"InferenceServer '{run.server_name}' does not exist in namespace '{run.ns}'; create it or fix "
                "spec.server",
            )
            self._drop_memo(run.uid)
        else:
            endpoint = manifests.service_endpoint(run.ns, run.server_name, run.server_spec)
            obs.endpoint = {**endpoint, "model": run.name}
        return run

    def _update_folder(self, run: _ModelPass, retry: int, cancelled: Callable[[], bool] | None, render: bool) -> bool:
        """The folder as the spec says: as the last render left it (a resync), or rendered now. False when the
        reconcile stops here: a render is needed but ``render`` is False, or the render was cancelled."""
        assert run.server is not None and run.server_spec is not None
        traffic = weights_in_force(run.model.spec, run.prev, run.generation)
        key = (*server_key(run.ns, run.server_name, run.server, run.server_spec), tuple(sorted(traffic.items())))
        memo = self._unchanged(run, key) if run.from_timer else None
        if memo is not None:
            run.obs.target, run.obs.config_digest = memo.target, memo.config_digest
            run.obs.repository_path, run.obs.rendered = memo.repository_path, memo.rendered
            return True
        if not render:
            return False
        self._render(run, key, retry, cancelled, traffic)
        return not run.cancelled

    def _read_replicas(self, run: _ModelPass, max_age: float | None) -> None:
        """The model's state on each replica (a changed folder: the replicas are asked to poll it first)."""
        assert run.server is not None
        uid = str(run.server["metadata"].get("uid") or "")
        run.endpoints, run.obs.index_error = self.parts.endpoints(run.ns, run.server_name, uid)
        assert run.server_spec is not None
        run.access = self.access.for_server(run.ns, run.server_name, run.server_spec)
        if run.changed and isinstance(run.access, ServerAccess) and run.endpoints:
            run.nudged = self._nudge(run.endpoints, run.access, run.name, (run.ns, run.name, run.uid))
        age = self.config.index_max_age if max_age is None else max_age
        run.obs.replicas = self.observe(run.server_name, run.endpoints, run.name, age, access=run.access)

    def _model_status(self, run: _ModelPass) -> tuple[dict[str, Any], bool]:
        """The new status (cold start, rollout, sequence routing included); True when a rollout decision was made."""
        new = status.model_status(run.obs, run.prev)
        self._cold_start(run.model, run.record, run.obs, new)
        decided = self._canary(run.model, run.record, new, run.endpoints, run.access)
        routing = None
        server_spec = run.server_spec
        if server_spec is not None:
            zero = server_spec.autoscaling is not None and scales_to_zero(server_spec.autoscaling)
            routing = sequence_routing.model_condition(run.model.config, server_spec, through_interceptor=zero)
        if routing is not None:
            new["conditions"] += status.conditions([routing], run.prev.get("conditions"), run.generation)
        if decided:
            self._put_decision_in_force(run.uid, new)
        return new, decided

    def _publish(self, run: _ModelPass, new: dict[str, Any], decided: bool, recheck: bool) -> dict[str, Any]:
        """Events, the status write (if it changed), the rechecks; a temporary failure raised for a retry."""
        ready = _condition(new, "Ready")
        if not decided and run.nudged and ready.get("reason") == "Loading" and not run.temporary:
            # the replicas are loading it right now: one status write once they answered (``_nudged``),
            # "Rendered" and "Ready" together, rather than "Loading" now and "Ready" a moment later
            self.rechecker.schedule(
                (run.ns, run.name, run.uid), context=self.parts.handler_context, delay=NUDGE_STATUS_WAIT
            )
            if run.rendered_note is not None:
                run.record.render_note = run.rendered_note
            return new
        note = self._take_render_note(run.uid)
        self._post_events(run.model.body, run.prev, new, run.rendered_note or note)
        self.parts.patch_status(MODELS, run.ns, run.name, run.prev, new)
        if decided or (recheck and (run.changed or not run.from_timer) and ready.get("reason") in SETTLING):
            self.rechecker.schedule((run.ns, run.name, run.uid), context=self.parts.handler_context)
        if run.temporary:
            raise kopf.TemporaryError(run.temporary, delay=run.delay)
        return new

    # ----------------------------------------------------------------------------------- the render
    def _unchanged(self, run: _ModelPass, key: tuple[Any, ...]) -> RenderMemo | None:
        """The last render, when nothing it depends on changed since: the generation, the server, the claim
        (checked again, from its cache) and the model folder's fingerprint."""
        assert run.server_spec is not None
        memo = run.record.rendered
        if memo is None or not memo.still_current(run.generation, key, run.prev.get("repositoryPath")):
            return None
        if run.trust > 0 and time.monotonic() - memo.at <= run.trust:
            return memo  # a recheck right after the render: the next resync looks at the folder
        try:
            self.parts.claim(run.ns, run.server_name, run.server_spec)
        except (ArtifactError, OSError):
            return None  # the render says why
        if self.writer.fingerprint(memo.server_dir, run.name) != memo.fingerprint:
            return None
        return memo

    def _render(
        self,
        run: _ModelPass,
        key: tuple[Any, ...],
        retry: int,
        cancelled: Callable[[], bool] | None,
        traffic: Mapping[int, float],
    ) -> None:
        """Render and sync the model into its server's folder, filling ``run.obs`` (and ``run.changed``,
        ``run.temporary``). A cancelled render (the object is going away) leaves ``obs.render_error``
        ("Cancelled", ...)."""
        assert run.server_spec is not None
        obs, sspec = run.obs, run.server_spec
        server_dir: Path | None = None
        failures = run.record.failures
        held = failures.held(run.generation) if run.from_timer else None
        self._drop_memo(run.uid)
        try:
            subpath, server_dir = self.parts.server_dir(run.ns, run.server_name, sspec)
            backends = sspec.backends or DEFAULT_BACKENDS
            versions, config = run.model.spec.versions, run.model.config
            rendered = render_versions(run.name, versions, config, backends, run.server_name, dict(traffic))
            allowed = allowed_backends(sspec, self.config.default_allowed_backends)
            _check_backend_allowed(rendered, run.server_name, allowed)
            obs.target = select_versions(rendered.config, rendered.versions)
            obs.config_digest = config_digest(rendered.config_text.encode("utf-8"))
            if held:
                obs.render_error, obs.failed_version = held
            else:
                self._sync(run, rendered, server_dir, subpath, cancelled)
        except ConfigError as exc:
            obs.render_error = ("InvalidSpec", str(exc))
        except ArtifactError as exc:
            if exc.reason == "Cancelled":
                obs.render_error = ("Cancelled", exc.message)
                obs.repository_path = ""
                return
            self._render_failed(run, exc, retry)
        if not held and (obs.render_error or ("",))[0] != "Queued":  # waiting is not a failure
            failures.remember(run.generation, obs.render_error, obs.failed_version)
        if server_dir is not None:
            self._remember_render(run, key, server_dir)

    def _sync(
        self,
        run: _ModelPass,
        rendered: RenderedModel,
        server_dir: Path,
        subpath: str,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        """Fetch, check and publish the model's files (cancelled when the object goes away meanwhile); then
        remove it from where the status says it was, if that was elsewhere."""
        models = self.models if self.records.attached else None  # the watch keeps the newest object: no API call
        gone = superseded(self.kube, models, run.ns, run.name, run.uid, run.generation, cancelled)
        fetch = Fetch(self._credentials(run.ns), gone, self.gate, self.quota)
        succeeded = False
        started = time.monotonic()
        try:
            result = self.writer.sync_model(server_dir, rendered, fetch=fetch)
            succeeded = True
        finally:
            fetch.finish(succeeded)
        if result.changed:
            run.obs.render_timing = cold_start.render_record(
                time.monotonic() - started, fetch.fetched, served=fetch.served
            )
        run.obs.repository_path = f"{subpath}/{run.name}"
        self._forget_old_location(run.ns, run.name, run.prev.get("repositoryPath"), run.obs.repository_path)
        if result.changed:
            run.changed = True
            run.rendered_note = _describe(result)

    def _render_failed(self, run: _ModelPass, exc: ArtifactError, retry: int) -> None:
        """The failure into ``run.obs``; a temporary one (network, a download slot) is retried soon."""
        run.obs.render_error = (exc.reason, exc.message)
        run.obs.failed_version = exc.version
        earlier = run.record.failures.of(run.generation) if exc.reason == "Queued" else None
        if earlier is not None:
            # a failed render tried again finds the namespace's download slots busy: the status keeps
            # saying why it failed (not "Queued"), and the resync tries again after the failure's backoff;
            # no retries every few seconds, so models waiting since their apply take the slots first
            run.obs.render_error, run.obs.failed_version = earlier
        elif exc.reason in TEMPORARY_REASONS:
            run.temporary = exc.message
            run.delay = retry_delay(exc.reason, retry)

    def _remember_render(self, run: _ModelPass, key: tuple[Any, ...], server_dir: Path) -> None:
        """The versions now on disk; after a success, the memo that lets a resync skip the next render."""
        obs = run.obs
        obs.rendered, fingerprint = self.writer.snapshot(server_dir, run.name)
        if fingerprint is None:  # the walk failed part way: the versions as a plain listing finds them
            obs.rendered = self.writer.versions_on_disk(server_dir, run.name)
        if obs.render_error is not None:
            return
        if fingerprint is not None:
            run.record.rendered = RenderMemo(
                run.generation,
                key,
                server_dir,
                fingerprint,
                obs.target,
                obs.config_digest,
                obs.repository_path,
                obs.rendered,
                time.monotonic(),
            )

    def _credentials(self, namespace: str) -> Callable[[str, str], dict[str, str]]:
        def lookup(name: str, host: str) -> dict[str, str]:
            try:
                secret = self.kube.read_core("Secret", name, namespace)
            except ApiException as exc:
                if exc.status == 403:
                    raise ArtifactError(
                        "CredentialsForbidden",
                        f"the operator may not read Secret '{namespace}/{name}': grant its service account "
                        "'get' on it (the Helm value rbac.secretNamespaces)",
                    ) from None
                raise
            if secret is None:
                raise ArtifactError(
                    "CredentialsNotFound", f"Secret '{name}' (source.credentialsSecret) does not exist in '{namespace}'"
                )
            return credential_data(secret, name, host)

        return lookup

    def _forget_old_location(self, namespace: str, name: str, old: str | None, new: str) -> None:
        """The model moved (other server or subPath): remove it from where it was.

        ``old`` comes from the object's status, which whoever may write the status subresource can
        change: it is only acted on when it names this model inside this namespace's folder.
        """
        if not old or old == new:
            return
        old_path = Path(old)
        if old_path.name != name:
            log.warning(
                "ignoring status.repositoryPath %r of model %s/%s: not this model's folder", old, namespace, name
            )
            return
        try:
            server_dir = self.writer.server_dir(namespace, str(old_path.parent), create=False)
        except ArtifactError as exc:
            log.warning("ignoring status.repositoryPath %r of model %s/%s: %s", old, namespace, name, exc.message)
            return
        try:
            self.writer.remove_model(server_dir, old_path.name)
        except ArtifactError as exc:
            log.warning("cannot remove %r of model %s/%s: %s", old, namespace, name, exc.message)

    # -------------------------------------------------------------------------------- the replicas
    def observe(
        self,
        server: str,
        endpoints: list[Endpoint],
        model: str,
        max_age: float,
        every: bool = False,
        access: ServerAccess | str | None = None,
    ) -> list[status.ReplicaView]:
        """This model's version states on each ready replica (on every one when none is ready, or ``every``)."""
        chosen = endpoints if every else [e for e in endpoints if e.ready] or endpoints
        views = []
        for endpoint in chosen:
            if isinstance(access, str):  # the pool's auth Secrets cannot be read: say so for every replica
                views.append(status.ReplicaView(endpoint.name, endpoint.ready, None, access))
                continue
            read = self.reader.read(endpoint, max_age, access or PLAIN, model)
            error = ""
            if read.rows is None:
                error = (
                    f"cannot read the repository index of InferenceServer '{server}' at {endpoint.url}: {read.error}"
                )
            states = None if read.rows is None else status.version_states(read.rows_of(model), model)
            views.append(status.ReplicaView(endpoint.name, endpoint.ready, states, error))
        return views

    def _nudge(self, endpoints: list[Endpoint], access: ServerAccess, name: str, key: tuple[str, str, str]) -> bool:
        """Ask the server's replicas to poll the model's folder now; it is rechecked as soon as they answer."""
        for endpoint in endpoints:
            self._nudged_keys[(endpoint.url, name)] = key
            self.nudger.nudge(endpoint.url, access, [name])
        return True

    def _nudged(
        self, url: str, access: ServerAccess, names: list[str], rows: dict[str, list[dict[str, Any]]] | None
    ) -> None:
        """A replica answered a poll request about ``names`` (``rows`` per name; None: it did not): their rows are
        fresh in the index cache and the models are rechecked now (without an answer: at the usual delays)."""
        if rows is not None:
            self.reader.update(url, access, rows)
        for name in names:
            key = self._nudged_keys.pop((url, name), None)
            if key is not None:
                self.rechecker.schedule(
                    key, context=self.parts.handler_context, delay=0.0 if rows is not None else None
                )

    def _recheck(self, key: Hashable) -> bool:
        """A follow-up after a change; True when no more are needed (Ready, failed for good, or gone)."""
        ns, name, uid = cast(tuple[str, str, str], key)
        body = self.models.get(uid) if self.records.attached else self.kube.get(MODELS, ns, name)
        if body is None or body["metadata"].get("uid") != uid or body["metadata"].get("deletionTimestamp"):
            return True
        new = self.reconcile_model(body, from_timer=True, max_age=0.5, recheck=False, trust=RECHECK_TRUST)
        return new is None or _condition(new, "Ready").get("reason") not in SETTLING

    # --------------------------------------------------------------------------------------- deletion
    def delete_model(self, body: Mapping[str, Any], runtime_seconds: float) -> None:
        """Remove the model folder, then hold the finalizer until no replica of the server has it loaded."""
        model = InferenceModel.from_body(body)
        ns, name, server_name = model.namespace, model.name, model.spec.server
        with self.lock(model.uid):
            server = self.lookup.server(ns, server_name)
            server_spec = None if server is None else InferenceServerSpec.from_body(server)
            recorded = model.status.get("repositoryPath")
            if server_spec is not None:
                try:
                    _, server_dir = self.parts.server_dir(ns, server_name, server_spec)
                    self.writer.remove_model(server_dir, name)
                except ArtifactError:
                    pass
            self._forget_old_location(ns, name, recorded, "")
            if server_spec is None:
                return
            loaded = self._still_loaded(ns, server_name, server_spec, name)
            if loaded and runtime_seconds < self.config.unload_timeout:
                raise kopf.TemporaryError(f"{UNLOAD_WAIT} versions {loaded}", delay=1)

    def _still_loaded(self, ns: str, server: str, sspec: InferenceServerSpec, name: str) -> list[int]:
        """Versions of the removed model some replica still has loaded (or is loading or unloading)."""
        endpoints, _ = self.parts.endpoints(ns, server)
        access = self.access.for_server(ns, server, sspec)
        answered: dict[str, list[dict[str, Any]]] = {}
        if isinstance(access, ServerAccess):
            # the replicas unload it now, and say so, rather than at their next poll
            tickets = {e.url: self.nudger.nudge(e.url, access, [name]) for e in endpoints}
            deadline = time.monotonic() + NUDGE_WAIT
            for url, (ticket,) in ((u, t) for u, t in tickets.items() if t):
                rows = ticket.wait(max(0.0, deadline - time.monotonic()))
                if rows is not None:
                    answered[url] = rows
        views = [
            status.ReplicaView(e.name, e.ready, status.version_states(answered[e.url], name))
            for e in endpoints
            if e.url in answered
        ]
        rest = [e for e in endpoints if e.url not in answered]
        if rest:
            views += self.observe(server, rest, name, max_age=0.5, every=True, access=access)
        return sorted(
            {s.version for v in views for s in v.states or () if s.state in ("READY", "LOADING", "UNLOADING")}
        )

    # ------------------------------------------------------------------------------ status parts
    def _cold_start(
        self, model: InferenceModel, record: ModelRecord, obs: status.ModelObservation, new: dict[str, Any]
    ) -> None:
        """``status.coldStart`` and, with ``spec.coldStartBudgetSeconds``, the ``ColdStartBudget`` condition."""
        prev = model.status
        if obs.render_timing is not None:
            record.render_record = obs.render_timing
        timing = record.render_record  # else the status keeps the one an earlier process wrote
        block = cold_start.status_block(timing, obs.replicas, prev.get("coldStart"))
        new["coldStart"] = block
        condition = cold_start.budget_condition(
            model.spec.cold_start_budget_seconds,
            (block or {}).get("render"),
            (block or {}).get("replicas") or [],
        )
        if condition is not None:
            new["conditions"] += status.conditions([condition], prev.get("conditions"), obs.generation)

    def _canary(
        self,
        model: InferenceModel,
        record: ModelRecord,
        new: dict[str, Any],
        endpoints: list[Endpoint],
        access: ServerAccess | str,
    ) -> bool:
        """Numbers per weighted version and spec.rollout's rule into ``new``; True when a decision was made."""
        prev = model.status
        if not model.spec.weights() and not prev.get("versionTraffic") and not prev.get("rollout"):
            return False
        stamp = status.now()
        window = record.rollout
        extra, decision = self.rollouts.extend(window, model, new, endpoints, access, stamp)
        if extra:
            new["conditions"] += status.conditions(extra, prev.get("conditions"), model.generation, stamp)
        if decision:
            phase = new["rollout"]["phase"]
            self.parts.event(model.body, "Warning" if phase == "RolledBack" else "Normal", phase, decision)
        return decision is not None

    def _put_decision_in_force(self, uid: str, new: dict[str, Any]) -> None:
        """A rollout decision changes the weights in force (``weights_in_force`` reads them from the status):
        the model is rendered again at once, and the in-memory copy carries the new status now, so the
        recheck, the resync pass and the work queue all render the decided weights before the watch brings
        the written status back."""
        record = self.records.get(uid)
        if record is not None:
            record.rendered = None
            if record.body is not None:
                record.body = {**record.body, "status": new}

    def _drop_memo(self, uid: str) -> None:
        """The render memo goes: the next reconcile renders (or looks at the folder) again."""
        record = self.records.get(uid)
        if record is not None:
            record.rendered = None

    def _take_render_note(self, uid: str) -> str | None:
        """What a render whose status write waited for the replicas changed (once: then it is said)."""
        record = self.records.get(uid)
        if record is None:
            return None
        note, record.render_note = record.render_note, None
        return note

    def _post_events(
        self, body: Mapping[str, Any], prev: Mapping[str, Any], new: Mapping[str, Any], rendered: str | None
    ) -> None:
        """One event per change of the Ready condition, not one per resync; a render that changed the folder
        (``rendered``: what it changed) is a Rendered event, or part of the Ready event when the model is
        Ready with it (one API request per model created, not two)."""
        before: Mapping[str, Any] = _condition(prev, "Ready")
        after = _condition(new, "Ready")
        changed = (before.get("status"), before.get("reason"), before.get("message")) != (
            after["status"],
            after["reason"],
            after["message"],
        )
        if changed and after["status"] == "True":
            said = f"{after['message']}; rendered: {rendered}" if rendered is not None else after["message"]
            self.parts.event(body, "Normal", "Ready", said)
            return
        if rendered is not None:
            self.parts.event(body, "Normal", "Rendered", rendered)
        if changed and after["reason"] not in ("Loading",):
            self.parts.event(body, "Warning", after["reason"], after["message"])


def _check_backend_allowed(model: RenderedModel, server: str, allowed: Sequence[str] | None) -> None:
    """The pool's spec.allowedBackends (a platform team's rule; None: every backend): a model of another backend
    is not rendered."""
    needed = backend_for(model.config)
    if allowed is not None and needed and needed not in allowed:
        code = (
            " (Python, TorchScript and SavedModel models are code that runs in the server)"
            if needed in CODE_BACKENDS
            else ""
        )
        raise ArtifactError(
            "BackendNotAllowed",
            f"InferenceServer '{server}' does not allow backend '{needed}'{code}: its spec.allowedBackends (or the "
            f"operator's default for pools that set none) is [{', '.join(allowed)}]; serve the model on another pool "
            "or ask the pool's owners",
        )


@contextlib.contextmanager
def _held(lock: threading.Lock, wait: bool) -> Iterator[bool]:
    """``lock`` taken (True), or not when ``wait`` is False and someone holds it (False)."""
    got = lock.acquire(blocking=wait)
    try:
        yield got
    finally:
        if got:
            lock.release()


def _condition(status_doc: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next((c for c in status_doc.get("conditions") or () if c.get("type") == ctype), {})


def _describe(result: SyncResult) -> str:
    """The Rendered event's message: what the sync changed in the folder."""
    parts = []
    if result.created_model:
        parts.append(f"created the model with versions {result.added_versions}")
    else:
        if result.added_versions:
            parts.append(f"added versions {result.added_versions}")
        if result.replaced_versions:
            parts.append(f"replaced versions {result.replaced_versions}")
        if result.removed_versions:
            parts.append(f"removed versions {result.removed_versions}")
        if result.config_changed:
            parts.append("updated config.pbtxt")
    return "; ".join(parts)
