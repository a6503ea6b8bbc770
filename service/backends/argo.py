"""The Argo Workflows backend: one Workflow per job attempt, made and read through the `kubernetes` client.

Every Kubernetes detail of the controller lives here. A job becomes an `argoproj.io/v1alpha1`
Workflow that references the `compile-and-train` WorkflowTemplate and passes parameters only, so it
is accepted where Argo runs with `templateReferencing: Strict`. The pool's placement travels as the
`pod-spec-patch` parameter: a strategic merge patch of the pod spec (nodeSelector, tolerations, and
the GPU resource of the container named `main`, merged by name) that every GPU step of the template
applies through `podSpecPatch` over its placement by the pool convention (`pod_spec_patch` says how
the pool's config wins). Its name is the job id (attempt 0) or `<job id>-retry-<n>`, so a
repeated submission meets 409 and reads the existing object back instead of starting a second run.
The trainer reports progress to the controller (`PUT /v1/jobs/{id}/progress`) with the Workflow's
`progress-token` parameter (one per attempt: a retry's Workflow gets a new one, and the previous
attempt's is refused), so nothing here reads progress from the Workflow.

Phase mapping (Workflow `status.phase` -> JobState):

====================  ==========  ==============================================================
phase                 state       reason
====================  ==========  ==============================================================
"" / missing          PENDING     Created: Argo's controller has not picked the Workflow up yet
Pending               PENDING     -
Running               RUNNING     -
Succeeded             SUCCEEDED   - (also with spec.shutdown set: it finished before the stop)
Failed                FAILED      JobFailed, OOMKilled or DeadlineExceeded (from status.message)
Error                 ERROR       InfrastructureError
Failed/Error + spec.shutdown      CANCELLED  Stopped (shutdown: Stop) or Terminated
anything else         PENDING     UnknownPhase
====================  ==========  ==============================================================

A step whose image cannot be pulled leaves its pod Pending for ever (Argo names the kubelet's reason
in the pod node's message: "ImagePullBackOff: Back-off pulling image …"). Once a pod has waited so for
`image_pull_grace_seconds`, the backend records its verdict on the Workflow (the annotation
`foxhunt.io/failure`) and terminates it in the same patch; a Workflow carrying that annotation is
FAILED with reason ImagePullFailed and the step and image in its message, whatever its phase.

Transient API failures (connection errors, 5xx, 429) are retried with bounded exponential backoff,
counted in `retries` by cause, and end in BackendUnavailable: never in a job state.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import random
import re
import time
from collections.abc import Callable, Generator, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.watch.watch import iter_resp_lines

from service.backends.argo_parameters import POOL_LABEL, workflow_parameters
from service.backends.base import BackendError, BackendNotFound, BackendUnavailable
from service.backends.idle_ticks import with_idle_ticks
from service.domain import BackendStatus, JobSpec, JobState, Placement
from service.kube import kube_configuration
from service.progress import progress_token

if TYPE_CHECKING:
    from service.settings import Settings

GROUP, VERSION, PLURAL = "argoproj.io", "v1alpha1", "workflows"
LABEL_JOB = "foxhunt.io/job-id"
LABEL_TENANT = "foxhunt.io/tenant"
LABEL_POOL = "foxhunt.io/pool"
LABEL_ATTEMPT = "foxhunt.io/attempt"
FAILURE_ANNOTATION = "foxhunt.io/failure"  # the controller's verdict on a Workflow it terminated
IMAGE_PULL_FAILURES = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
MANAGED_BY = ("app.kubernetes.io/managed-by", "foxhunt")
SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"
POD_WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
MAIN_CONTAINER = "main"  # Argo's name for a step's own container
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})

_PHASES = {
    "": JobState.PENDING,
    "Pending": JobState.PENDING,
    "Running": JobState.RUNNING,
    "Succeeded": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    "Error": JobState.ERROR,
}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # fullmatch: `$` would pass "a\n"
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


# ---- the Workflow we create --------------------------------------------------------------------
def workflow_name(job_id: str, attempt: int) -> str:
    """Deterministic per (job, attempt): a retry is a new Workflow, a resubmission is not."""
    return job_id if attempt == 0 else f"{job_id}-retry-{attempt}"


def pod_spec_patch(placement: Placement) -> str:
    """The pool's placement as a pod spec patch (compact JSON) for Argo's `podSpecPatch`.

    Every GPU step of the template already carries the placement by convention (`pool_convention`:
    nodeSelector POOL_LABEL=<gpu-pool>, tolerations of the GPU taint and the pool's taint); Argo applies
    this patch over it as a Kubernetes strategic merge patch of the PodSpec, and the patch makes the
    pool's own config win:
    - nodeSelector is a map, merged key by key: the pool's labels are set, and the template's POOL_LABEL
      is deleted (`null`) when the pool does not select on it, so a pod selects exactly the pool's labels;
    - tolerations have no patch merge key, so the patch's list replaces the template's: the pool's full
      list is always sent, an empty one too (then the pods tolerate nothing);
    - containers merge by name: the entry named `main` sets the step's GPU requests and limits beside its
      own CPU and memory. A pool without GPUs adds no resources."""
    node_selector: dict[str, str | None] = {POOL_LABEL: None} | dict(placement.node_selector)
    patch: dict[str, Any] = {"nodeSelector": node_selector, "tolerations": placement.tolerations}
    if placement.gpus:
        gpus = {placement.gpu_resource: str(placement.gpus)}
        patch["containers"] = [{"name": MAIN_CONTAINER, "resources": {"requests": gpus, "limits": gpus}}]
    return json.dumps(patch, separators=(",", ":"), sort_keys=True)


def workflow_manifest(spec: JobSpec, *, progress_secret: str, template: str = "compile-and-train") -> dict[str, Any]:
    """The Workflow for one job attempt: a template reference, parameters and our labels, nothing else."""
    if not _DNS_LABEL.fullmatch(spec.job_id):
        raise ValueError(f"job id {spec.job_id!r} is not a lowercase RFC 1123 label of at most 63 characters")
    for what, value in (("tenant", spec.tenant), ("pool", spec.pool)):
        if not _LABEL_VALUE.fullmatch(value):
            raise ValueError(f"{what} {value!r} is not a valid Kubernetes label value")
    labels = {
        LABEL_JOB: spec.job_id,
        LABEL_TENANT: spec.tenant,
        LABEL_POOL: spec.pool,
        LABEL_ATTEMPT: str(spec.attempt),
        MANAGED_BY[0]: MANAGED_BY[1],
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workflow",
        "metadata": {"name": workflow_name(spec.job_id, spec.attempt), "labels": labels},
        "spec": {
            "workflowTemplateRef": {"name": template},
            "arguments": {
                "parameters": workflow_parameters(
                    spec,
                    pod_spec_patch=pod_spec_patch(spec.placement),
                    progress_token=progress_token(progress_secret, spec.job_id, spec.attempt),
                )
            },
        },
    }


# ---- reading a Workflow back -------------------------------------------------------------------
def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def _reason(state: JobState, phase: str, message: str, shutdown: str) -> str | None:
    if state is JobState.CANCELLED:
        return "Terminated" if shutdown == "Terminate" else "Stopped"
    if state is JobState.FAILED:
        if "OOMKilled" in message:
            return "OOMKilled"
        return "DeadlineExceeded" if "deadline" in message.lower() else "JobFailed"
    if state is JobState.ERROR:
        return "InfrastructureError"
    if phase not in _PHASES:
        return "UnknownPhase"
    return "Created" if phase == "" else None


def _failed_step(status: dict[str, Any]) -> str | None:
    """Which step failed and how, from the Workflow's nodes: "step train failed: Error (exit code 1)".

    Argo's own message names only a node ("child 'job-1-3877072985' failed"); the step's pod node
    carries the template's name and the reason (the exit code, OOMKilled, a deadline). The last pod to
    fail is the one that ended the job; the exit handler's pods are not steps of the job.
    """
    pods = [
        node
        for node in (status.get("nodes") or {}).values()
        if node.get("type") == "Pod"
        and node.get("phase") in ("Failed", "Error")
        and ".onExit" not in (node.get("name") or "")
    ]
    if not pods:
        return None
    last = max(pods, key=lambda node: node.get("finishedAt") or "")
    step = last.get("templateName") or last.get("displayName") or "?"
    return f"step {step} failed: {last.get('message') or last.get('phase')}"


def stuck_image_pull(status: dict[str, Any], now: datetime, grace_seconds: float) -> str | None:
    """ "step train cannot start: ImagePullBackOff: Back-off pulling image …" when a step's pod has waited
    for its image longer than the grace (a registry's hiccup is retried by the kubelet meanwhile)."""
    for node in (status.get("nodes") or {}).values():
        message = node.get("message") or ""
        if node.get("type") != "Pod" or node.get("phase") != "Pending" or not message.startswith(IMAGE_PULL_FAILURES):
            continue
        started = _time(node.get("startedAt"))
        if started is None or (now - started).total_seconds() >= grace_seconds:
            return f"step {node.get('templateName') or node.get('displayName') or '?'} cannot start: {message}"
    return None


def status_from_workflow(obj: dict[str, Any]) -> BackendStatus:
    """Map one Workflow object (as the API returns it) to our status; see the module docstring."""
    metadata = obj.get("metadata") or {}
    verdict = (metadata.get("annotations") or {}).get(FAILURE_ANNOTATION)
    status = obj.get("status") or {}
    phase = status.get("phase") or ""
    message = status.get("message") or ""
    shutdown = (obj.get("spec") or {}).get("shutdown") or ""
    state = _PHASES.get(phase, JobState.PENDING)
    if shutdown and state in (JobState.FAILED, JobState.ERROR):
        state = JobState.CANCELLED
    if state in (JobState.FAILED, JobState.ERROR):
        message = _failed_step(status) or message
    reason = _reason(state, phase, message, shutdown)
    if verdict:
        state, reason, message = JobState.FAILED, "ImagePullFailed", verdict
    return BackendStatus(
        job_id=(metadata.get("labels") or {}).get(LABEL_JOB, metadata.get("name", "")),
        state=state,
        reason=reason,
        phase=phase,
        message=message or None,
        started_at=_time(status.get("startedAt")),
        finished_at=_time(status.get("finishedAt")),
        attempt=_attempt(obj),
    )


def _attempt(obj: dict[str, Any]) -> int:
    value = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_ATTEMPT, "0")
    return int(value) if value.isdigit() else 0


def _latest_per_job(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each job's newest attempt: older attempts' Workflows may still exist until Argo's TTL removes them."""
    latest: dict[str, dict[str, Any]] = {}
    for obj in items:
        job_id = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_JOB)
        if job_id and (job_id not in latest or _attempt(obj) > _attempt(latest[job_id])):
            latest[job_id] = obj
    return latest


class ArgoBackend:
    """Jobs as Argo Workflows in one namespace. Blocking calls, safe to share between threads."""

    name = "argo"

    def __init__(
        self,
        namespace: str,
        api_client: client.ApiClient,
        *,
        progress_secret: str,
        template: str = "compile-and-train",
        max_attempts: int = 5,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 8.0,
        request_timeout: float = 30.0,
        poll_seconds: float = 2.0,
        page_size: int = 500,
        image_pull_grace_seconds: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.namespace = namespace
        self.progress_secret = progress_secret
        self.template = template
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.request_timeout = request_timeout
        self.poll_seconds = poll_seconds
        self.page_size = page_size
        self.image_pull_grace_seconds = image_pull_grace_seconds
        self._sleep = sleep
        self._clock = clock
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self.retries: collections.Counter[str] = collections.Counter()  # connection / server_error / throttled
        self.relists = 0  # watch restarts from a fresh list (410 Gone, or the first list)

    @classmethod
    def from_settings(cls, settings: Settings) -> ArgoBackend:
        """Kubeconfig file if the settings name one, in-cluster service account otherwise."""
        if settings.progress_secret is None:
            raise BackendError(
                "FOXHUNT_PROGRESS_SECRET is required with the argo backend (shared by every controller replica)"
            )
        try:
            configuration = kube_configuration(settings)
        except (ConfigException, OSError) as error:
            raise BackendError(f"cannot load the Kubernetes configuration: {error}") from error
        return cls(
            settings.argo_namespace,
            client.ApiClient(configuration),
            progress_secret=settings.progress_secret.get_secret_value(),
            template=settings.argo_workflow_template,
            image_pull_grace_seconds=settings.image_pull_grace_seconds,
        )

    # ---- the Backend interface ----------------------------------------------------------------
    def submit(self, spec: JobSpec) -> BackendStatus:
        body = workflow_manifest(spec, progress_secret=self.progress_secret, template=self.template)
        name = body["metadata"]["name"]
        try:
            obj = self._call(
                f"create Workflow {name}",
                self._custom.create_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                body,
                passthrough=(409,),
            )
        except ApiException:  # 409 AlreadyExists: this attempt was submitted before
            obj = self._read_workflow(name)
            owner = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_JOB)
            if owner != spec.job_id:
                raise BackendError(f"Workflow {name} exists but belongs to job {owner!r}") from None
        return status_from_workflow(obj)

    def status(self, job_id: str) -> BackendStatus:
        return status_from_workflow(self._judged(self._latest(job_id)))

    def list_statuses(self) -> list[BackendStatus]:
        items, _ = self._list_all()
        return [status_from_workflow(self._judged(obj)) for _, obj in sorted(_latest_per_job(items).items())]

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        """JSON merge patch of spec.shutdown; a no-op on an ended job or one already being terminated."""
        obj = self._latest(job_id)
        current = (obj.get("spec") or {}).get("shutdown")
        if status_from_workflow(obj).state.terminal or current == "Terminate" or (current and not force):
            return
        shutdown = "Terminate" if force else "Stop"
        self._patch_workflow("cancel", obj["metadata"]["name"], {"spec": {"shutdown": shutdown}})

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[str]:
        """The `main` container's lines of each of the workflow's pods, in creation order."""
        name = self._latest(job_id)["metadata"]["name"]
        done: set[str] = set()
        while True:
            ended = follow and self._workflow_status(name).state.terminal
            pods = self._call(
                f"list pods of {name}",
                self._core.list_namespaced_pod,
                self.namespace,
                label_selector=f"{POD_WORKFLOW_LABEL}={name}",
            )
            ordered = sorted(pods.items, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))
            for pod in ordered:
                if pod.metadata.name not in done:
                    finished = pod.status is not None and pod.status.phase in ("Succeeded", "Failed")
                    complete = yield from self._pod_log(pod.metadata.name, follow and not finished)
                    if complete:
                        done.add(pod.metadata.name)
            if not follow or ended:
                return
            self._sleep(self.poll_seconds)
            yield ""  # as in with_idle_ticks: the consumer may stop between polls

    def watch(self, *, timeout_seconds: float | None = None) -> Iterator[BackendStatus]:
        """List, then watch from the list's resourceVersion; yield each job's status when it changes.

        The first list only sets the baseline (as the local backend does): the reconciler reads the
        full state with `list_statuses`.
        Bookmarks move the resume point forward without an object; 410 Gone (the resume point was
        compacted away) relists and yields what changed meanwhile. Deletions yield nothing: the
        reconciler learns of a vanished Workflow from `list_statuses`.
        """
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        seen: dict[str, BackendStatus] = {}
        attempts: dict[str, int] = {}
        rv: str | None = None
        failures = 0
        baseline = True
        while deadline is None or time.monotonic() < deadline:
            remaining = 300 if deadline is None else max(1, math.ceil(deadline - time.monotonic()))
            try:
                if rv is None:
                    items, rv = self._list_all()
                    self.relists += 1
                    for obj in _latest_per_job(items).values():
                        changed = list(self._changed(obj, seen, attempts))
                        if not baseline:
                            yield from changed
                    baseline = False
                stream = watch.Watch().stream(
                    self._list_workflows,
                    label_selector=SELECTOR,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=remaining,
                    _request_timeout=(self.request_timeout, remaining + 10),
                )
                for event in stream:
                    failures = 0
                    obj = event["raw_object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        yield from self._changed(obj, seen, attempts)
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            except ApiException as error:
                if error.status == 410:
                    rv = None
                    continue
                if error.status not in TRANSIENT_STATUSES:
                    raise BackendError(f"watch Workflows: Kubernetes API answered {error.status}") from error
                failures = self._backoff_or_give_up("watch Workflows", _cause(error.status), failures)
            except (urllib3.exceptions.HTTPError, OSError):
                failures = self._backoff_or_give_up("watch Workflows", "connection", failures)

    def ping(self) -> None:
        """One cheap list (limit 1), no retries: readiness must answer fast."""
        try:
            self._list_workflows(limit=1, _request_timeout=self.request_timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            raise BackendUnavailable(f"Kubernetes API not usable: {_describe(error)}") from error

    # ---- helpers ------------------------------------------------------------------------------
    def _list_workflows(self, **query: Any) -> Any:
        """The Workflows of our namespace; `query` narrows it (selector, paging, watch). Its docstring has no
        `:return:` line, so a watch over it hands back raw objects, which is all we read."""
        return self._custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, **query)

    def _judged(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The Workflow, failed and terminated first if a step's image cannot be pulled (see the module
        docstring): one merge patch records the verdict and stops the pods that wait."""
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        phase = (obj.get("status") or {}).get("phase") or ""
        if FAILURE_ANNOTATION in annotations or phase not in ("", "Pending", "Running"):
            return obj
        verdict = stuck_image_pull(obj.get("status") or {}, self._clock(), self.image_pull_grace_seconds)
        if verdict is None:
            return obj
        patch = {"metadata": {"annotations": {FAILURE_ANNOTATION: verdict}}, "spec": {"shutdown": "Terminate"}}
        return self._patch_workflow("fail", obj["metadata"]["name"], patch)

    def _patch_workflow(self, what: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (custom resources take no strategic merge); returns the patched object."""
        return self._call(  # type: ignore[no-any-return]
            f"{what} Workflow {name}", self._custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace,
            PLURAL, name, patch,
        )  # fmt: skip

    def _read_workflow(self, name: str) -> dict[str, Any]:
        return self._call(
            f"read Workflow {name}",
            self._custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
        )

    def _workflow_status(self, name: str) -> BackendStatus:
        return status_from_workflow(self._read_workflow(name))

    def _latest(self, job_id: str) -> dict[str, Any]:
        """The newest attempt's Workflow of a job, or BackendNotFound."""
        selector = f"{SELECTOR},{LABEL_JOB}={job_id}" if _LABEL_VALUE.fullmatch(job_id) else None
        if selector is None:
            raise BackendNotFound(f"no Workflow for job {job_id!r}")
        found = self._call(f"list Workflows of job {job_id}", self._list_workflows, label_selector=selector)
        latest = _latest_per_job(found.get("items") or [])
        if job_id not in latest:
            raise BackendNotFound(f"no Workflow for job {job_id!r}")
        return latest[job_id]

    def _list_all(self) -> tuple[list[dict[str, Any]], str]:
        """Every Workflow we manage (paging through `continue`), and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self._call(
                "list Workflows",
                self._list_workflows,
                label_selector=SELECTOR,
                limit=self.page_size,
                _continue=token,
            )
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, page["metadata"]["resourceVersion"]

    def _changed(
        self, obj: dict[str, Any], seen: dict[str, BackendStatus], attempts: dict[str, int]
    ) -> Iterator[BackendStatus]:
        """Yield the object's status if it is the job's newest attempt and differs from the last one."""
        status = status_from_workflow(self._judged(obj))
        if _attempt(obj) < attempts.get(status.job_id, 0) or seen.get(status.job_id) == status:
            return
        attempts[status.job_id] = _attempt(obj)
        seen[status.job_id] = status
        yield status

    def _pod_log(self, pod: str, follow: bool) -> Generator[str, None, bool]:
        """Yield one pod's lines ending in a newline (as the local backend's do); return False if its
        container has not started yet (try again later)."""
        try:
            response = self._call(
                f"read log of pod {pod}",
                self._core.read_namespaced_pod_log,
                pod,
                self.namespace,
                container="main",
                follow=follow,
                _preload_content=False,
                _request_timeout=None if follow else self.request_timeout,
                passthrough=(400,),
            )
        except ApiException:  # 400: "container main is waiting to start"
            return False
        lines: Iterator[str] = (line + "\n" for line in iter_resp_lines(response))
        if follow:  # a quiet pod must not hold the consumer's thread: see idle_ticks
            lines = with_idle_ticks(
                lines, every=self.poll_seconds, interrupt=partial(_shut_down, response), name=f"log:{pod}"
            )
        try:
            for line in lines:
                # A kubelet ends a followed log when the container exits; one that does not (kwok's, on
                # the test cluster) must not hold the follower on a finished pod: checked while quiet.
                if not line and self._pod_finished(pod):
                    break
                yield line
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise BackendUnavailable(f"log stream of pod {pod} broke: {_describe(error)}") from error
        finally:
            if isinstance(lines, Generator):
                lines.close()  # interrupts a read still blocked in the stream
            response.release_conn()
        return True

    def _pod_finished(self, pod: str) -> bool:
        obj = self._call(f"read pod {pod}", self._core.read_namespaced_pod, pod, self.namespace)
        return obj.status is not None and obj.status.phase in ("Succeeded", "Failed")

    def _call(
        self, what: str, fn: Callable[..., Any], *args: Any, passthrough: tuple[int, ...] = (), **kwargs: Any
    ) -> Any:
        """Call the API, retrying transient failures with backoff; 404 -> BackendNotFound.

        Any: the client's custom-object calls are typed `object` though they return the parsed JSON."""
        failures = 0
        while True:
            try:
                kwargs.setdefault("_request_timeout", self.request_timeout)
                return fn(*args, **kwargs)
            except ApiException as error:
                if error.status in passthrough:
                    raise
                if error.status == 404:
                    raise BackendNotFound(f"{what}: not found") from error
                if error.status not in TRANSIENT_STATUSES:
                    raise BackendError(f"{what}: Kubernetes API answered {_describe(error)}") from error
                failures = self._backoff_or_give_up(what, _cause(error.status), failures, _retry_after(error))
            except (urllib3.exceptions.HTTPError, OSError):
                failures = self._backoff_or_give_up(what, "connection", failures)

    def _backoff_or_give_up(self, what: str, cause: str, failures: int, retry_after: float = 0.0) -> int:
        """Count the failure; sleep (exponential, jittered, capped) or raise BackendUnavailable."""
        self.retries[cause] += 1
        failures += 1
        if failures >= self.max_attempts:
            raise BackendUnavailable(f"{what}: Kubernetes API unavailable after {failures} attempts ({cause})")
        delay = min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (failures - 1))
        self._sleep(max(retry_after, delay * random.uniform(0.5, 1.0)))
        return failures


def _cause(status: int | None) -> str:
    return "throttled" if status == 429 else "server_error"


def _retry_after(error: ApiException) -> float:
    with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
        return min(30.0, float((error.headers or {})["Retry-After"]))
    return 0.0


def _shut_down(response: Any) -> None:
    """Interrupt a read blocked in `response`; the read may have just ended and handed its connection
    back to the pool, which leaves nothing to interrupt."""
    with contextlib.suppress(RuntimeError):
        response.shutdown()


def _describe(error: BaseException) -> str:
    """One line: the API Status message when there is one, else the exception's text."""
    if isinstance(error, ApiException):
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            return f"{error.status} {json.loads(error.body or '')['message']}"
        return f"{error.status} {error.reason}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__
