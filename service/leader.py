"""Leader election on a coordination.k8s.io/v1 Lease: of several controller replicas, only the one
holding the Lease runs reconcile passes (the API is served by all of them).

The holder renews the Lease every `retry_seconds`. The others read it and take it over once it has
not changed for its `leaseDurationSeconds`, measured on their own clock from when they saw it change
(as client-go does), so clock skew between replicas does not matter. Every write carries the
resourceVersion it read: of two replicas that take an expired Lease at once, the API server lets one
through and answers 409 Conflict to the other. A holder that cannot renew for `renew_deadline_seconds`
(shorter than the lease) stops leading before another replica may take over. A graceful stop
releases the Lease, so that another replica takes over at its next try instead of after expiry.

`leading` is checked by the clock, not only by what the election thread last decided: it is true
only while less than the renew deadline has passed since the start of the last successful renew
(as client-go's leader election does). A process that was stopped (SIGSTOP, a long GC pause, a
starved thread) wakes up with its flag still set but its deadline gone, and does not act before its
election thread has renewed again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from service.kube import kube_configuration
from service.settings import Settings

log = logging.getLogger(__name__)


class LeaderElector:
    """Takes and renews one Lease on a thread of its own; `leading` says whether this replica holds it
    (the reconciler's `Leadership`)."""

    def __init__(
        self,
        api: client.CoordinationV1Api,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int,
        renew_deadline_seconds: float,
        retry_seconds: float,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_seconds < renew_deadline_seconds < lease_seconds:
            raise ValueError(
                f"leader election needs retry ({retry_seconds}s) < renew deadline ({renew_deadline_seconds}s) "
                f"< lease duration ({lease_seconds}s)"
            )
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline_seconds
        self.retry = retry_seconds
        self.on_change = on_change
        self.clock = clock
        self._leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: tuple[str | None, str | None] | None = None  # (holder, resourceVersion) last read
        self._observed_at = 0.0
        self._renewed_at = 0.0

    @classmethod
    def from_settings(cls, settings: Settings, on_change: Callable[[bool], None] | None = None) -> LeaderElector:
        """The kubeconfig file if the settings name one, the in-cluster service account otherwise."""
        try:
            configuration = kube_configuration(settings)
        except (ConfigException, OSError) as error:
            raise ValueError(f"leader election cannot load the Kubernetes configuration: {error}") from error
        return cls(
            client.CoordinationV1Api(client.ApiClient(configuration)),
            namespace=settings.argo_namespace,
            name=settings.leader_election_lease,
            identity=f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
            lease_seconds=settings.leader_election_lease_seconds,
            renew_deadline_seconds=settings.leader_election_renew_deadline_seconds,
            retry_seconds=settings.leader_election_retry_seconds,
            on_change=on_change,
        )

    @property
    def leading(self) -> bool:
        """Whether this replica holds the Lease now: taken or renewed less than the renew deadline ago, by the
        clock (a flag alone may be stale after a stall), so it stops acting before another replica may take over."""
        return self._leading.is_set() and self.clock() - self._renewed_at < self.renew_deadline

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop trying; a holder gives the Lease up (unless `release` is False, as in a crash)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.retry + 30)
            self._thread = None
        if self.leading and release:
            self._release()
        self._set_leading(False)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.attempt()
            self._stop.wait(self.retry)

    def attempt(self) -> bool:
        """One try to take or renew the Lease; True while this replica leads."""
        now = self.clock()  # before the request: the Lease is valid from when it was asked for, not answered
        try:
            held: bool | None = self._take_or_renew()
        except (ApiException, HTTPError, OSError) as error:
            log.warning("leader election: cannot reach the Lease %s/%s: %s", self.namespace, self.name, error)
            held = None  # not known: keep leading until the renew deadline passes
        if held:
            self._renewed_at = now
            self._set_leading(True)
        elif held is False or now - self._renewed_at > self.renew_deadline:
            self._set_leading(False)
        return self.leading

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading.is_set():
            return
        if leading:
            self._leading.set()
        else:
            self._leading.clear()
        log.info("leader election: %s %s Lease %s/%s", self.identity, "holds" if leading else "no longer holds",
                 self.namespace, self.name)  # fmt: skip
        if self.on_change is not None:
            self.on_change(leading)

    def _take_or_renew(self) -> bool:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            return self._write(None, client.V1LeaseSpec(lease_transitions=0), holder=None)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or None
        version = lease.metadata.resource_version if lease.metadata else None
        now = self.clock()
        if (holder, version) != self._observed:
            self._observed, self._observed_at = (holder, version), now
        duration = spec.lease_duration_seconds or self.lease_seconds
        if holder not in (None, self.identity) and now - self._observed_at < duration:
            return False  # another replica holds a Lease that has not expired
        return self._write(version, spec, holder=holder)  # free, expired, or ours to renew

    def _write(self, version: str | None, old: client.V1LeaseSpec, *, holder: str | None) -> bool:
        """Create (no version) or replace the Lease as ours; False if another replica wrote first (409)."""
        now = datetime.now(UTC)
        taking = holder != self.identity
        spec = client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=self.lease_seconds,
            acquire_time=now if taking else old.acquire_time,
            renew_time=now,
            lease_transitions=(old.lease_transitions or 0) + (1 if taking and version is not None else 0),
        )
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace, resource_version=version),
            spec=spec,
        )
        try:
            if version is None:
                written = self.api.create_namespaced_lease(self.namespace, body)
            else:
                written = self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as error:
            if error.status == 409:  # AlreadyExists or Conflict: someone else's write won
                return False
            raise
        written_version = written.metadata.resource_version if written.metadata else None
        self._observed, self._observed_at = (self.identity, written_version), self.clock()
        return True

    def _release(self) -> None:
        """Give the Lease up (no holder), so that another replica need not wait for it to expire."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except (ApiException, HTTPError, OSError) as error:
            log.warning("leader election: could not release the Lease %s/%s: %s", self.namespace, self.name, error)
