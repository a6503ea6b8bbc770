"""Stage 1's stand-in for a kubelet and argoexec: runs the pods of Argo Workflows on kwok's fake nodes.

kwok moves a pod to Running and stops there (scripts/cluster/kwok-stages.yaml); nothing would run its
containers. `PodRunner` does, as a kubelet and Argo's executor would, but as a process on this machine
rather than in a container:
- the `main` container's command and arguments exactly as the pod spec holds them (Argo has already
  substituted every parameter, the pool's podSpecPatch is applied), `python` being this interpreter;
- its volumes as folders: the PersistentVolume bound to a claim is its hostPath, an emptyDir a folder of
  the pod's own, a ConfigMap or Secret its keys as files, Argo's raw input artifacts their data; every
  mount path in an argument or environment value is rewritten to its folder;
- its environment with `valueFrom` read from the ConfigMaps and Secrets, and `$(NAME)` expanded;
- its output as the pod's log (a kwok `Logs` object points `kubectl logs` at the file);
- what argoexec reports: a WorkflowTaskResult named by the node id, with the step's `result` (stdout)
  and exit code, marked complete, then the pod's end with that exit code (a `foxhunt.io/exit-code`
  annotation that kwok's stage turns into the containers' terminated state).
What it does not do (the goal of stage 2, a real kubelet): images, users, read-only roots, resources.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, watch

ARGO = ("argoproj.io", "v1alpha1")
KWOK = ("kwok.x-k8s.io", "v1alpha1")
EXIT_ANNOTATION = "foxhunt.io/exit-code"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
REFERENCE = re.compile(r"\$\((\w+)\)")


@dataclass
class PodRun:
    """One pod this runner ran: its step (the template's name), exit code and output."""

    pod: str
    workflow: str
    template: str
    argv: list[str]
    exit_code: int
    stdout: str
    log: Path


# Decides, before a pod runs, whether to run it: None runs it, an int ends it at once with that exit code
# (a test's way of making one attempt of a step fail).
Verdict = Callable[[client.V1Pod, str], int | None]


@dataclass
class PodRunner:
    """Runs every pod of Argo Workflows in `namespace` that kwok has moved to Running, on a thread."""

    api: client.ApiClient  # what a kubelet reads and writes (pods, volumes, config)
    reporter: client.ApiClient  # argoexec's: the pods' service account, whose RBAC allows task results
    namespace: str
    root: Path  # folders of the pods and of the hostPath volumes
    verdict: Verdict = lambda pod, template: None
    timeout: float = 600.0
    runs: list[PodRun] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._core = client.CoreV1Api(self.api)
        self._custom = client.CustomObjectsApi(self.api)
        self._stop = threading.Event()
        self._started: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._processes: set[subprocess.Popen[bytes]] = set()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)

    def __enter__(self) -> PodRunner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._watch.stop()
        self._thread.join(timeout=30)
        for process in list(self._processes):  # a test that ended early leaves no trainer behind
            process.kill()
        for thread in self._threads:
            thread.join(timeout=60)
        if self.errors and exc[0] is None:
            raise self.errors[0]

    def steps(self, workflow: str) -> list[str]:
        """The templates of `workflow`'s pods that ran, in the order they ended."""
        return [run.template for run in list(self.runs) if run.workflow == workflow]

    # ---- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(
                    self._core.list_namespaced_pod,
                    self.namespace,
                    label_selector=WORKFLOW_LABEL,
                    timeout_seconds=5,
                ):
                    self._consider(event["object"])
                    if self._stop.is_set():
                        return
            except Exception as error:
                if not self._stop.is_set():
                    traceback.print_exc()
                    self.errors.append(error)
                    return

    def _consider(self, pod: client.V1Pod) -> None:
        name = pod.metadata.name
        if name in self._started or (pod.status.phase or "") != "Running" or pod.metadata.deletion_timestamp:
            return
        if EXIT_ANNOTATION in (pod.metadata.annotations or {}):
            return
        self._started.add(name)
        thread = threading.Thread(target=self._run_reporting, args=(pod,), name=f"pod:{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run_reporting(self, pod: client.V1Pod) -> None:
        try:
            self._run(pod)
        except Exception as error:  # raised by __exit__; printed now, as a test may wait long for the job
            traceback.print_exc()
            self.errors.append(error)

    # ---- one pod ------------------------------------------------------------------------------
    def _run(self, pod: client.V1Pod) -> None:
        name = pod.metadata.name
        main = next(c for c in pod.spec.containers if c.name == "main")
        env_of = {e.name: e.value for e in main.env or [] if e.value is not None}
        # Argo gives the template (JSON) to its own containers (init, wait), not to main.
        argo_env = [e for c in [*(pod.spec.init_containers or []), *pod.spec.containers] for e in c.env or []]
        template = json.loads(next(e.value for e in argo_env if e.name == "ARGO_TEMPLATE"))
        node_id, workflow = env_of["ARGO_NODE_ID"], pod.metadata.labels[WORKFLOW_LABEL]
        home = self.root / "pods" / name
        home.mkdir(parents=True)
        log = home / "main.log"
        log.touch()
        log.with_suffix(".cri").touch()
        self._create_logs_object(name, log.with_suffix(".cri"))
        mounts = self._mounts(pod, main, template, home)
        env = self._environment(main, mounts)
        argv = [*(main.command or []), *(main.args or [])]
        if argv and argv[0].endswith("/argoexec") and "--" in argv:  # Argo's emissary wraps the command
            argv = argv[argv.index("--") + 1 :]
        argv = [_rewrite(part, mounts) for part in argv]
        argv = [REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), part) for part in argv]
        if argv and argv[0] == "python":
            argv[0] = sys.executable
        verdict = self.verdict(pod, template.get("name", ""))
        # Argo signals the steps running when a Workflow is stopped, not the exit handler it runs then
        on_exit = ".onExit" in (pod.metadata.annotations or {}).get("workflows.argoproj.io/node-name", "")
        if verdict is None:
            exit_code, stdout = self._execute(argv, env, home, log, None if on_exit else workflow)
        else:
            exit_code, stdout = verdict, ""
        # argoexec keeps stdout as the step's result only where another step reads it (Argo sets this):
        # withParam's children must not carry a result that is not JSON, Argo parses each one.
        result = stdout.strip() if env_of.get("ARGO_INCLUDE_SCRIPT_OUTPUT") == "true" else None
        self._report(workflow, node_id, exit_code, result)
        self.runs.append(PodRun(name, workflow, template.get("name", ""), argv, exit_code, stdout, log))
        self._core.patch_namespaced_pod(
            name, self.namespace, {"metadata": {"annotations": {EXIT_ANNOTATION: str(exit_code)}}}
        )

    def _execute(
        self, argv: list[str], env: dict[str, str], home: Path, log: Path, workflow: str | None
    ) -> tuple[int, str]:
        """Run the command; SIGTERM it once its Workflow is shut down (Argo's controller then execs
        `argoexec kill 15 1` in the pod's containers, which kwok's pods cannot take).

        Its lines go to `log` as they come (plain text, for the tests) and to the container log that
        kwok serves (`log` with suffix .cri, in the CRI format a kubelet's runtime writes)."""
        output: list[bytes] = []
        lock = threading.Lock()
        with log.open("ab", buffering=0) as plain, log.with_suffix(".cri").open("ab", buffering=0) as cri:
            process = subprocess.Popen(argv, env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self._processes.add(process)

            def tee(stream: Any, name: bytes) -> None:  # stdout is also the step's result
                for line in stream:
                    if name == b"stdout":
                        output.append(line)
                    stamp = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
                    with lock:
                        plain.write(line)
                        cri.write(stamp.encode() + b" " + name + b" F " + line.rstrip(b"\n") + b"\n")

            readers = [
                threading.Thread(target=tee, args=(process.stdout, b"stdout"), daemon=True),
                threading.Thread(target=tee, args=(process.stderr, b"stderr"), daemon=True),
            ]
            for reader in readers:
                reader.start()
            deadline = time.monotonic() + self.timeout
            signalled = False
            while process.poll() is None:
                if time.monotonic() > deadline:
                    process.kill()
                elif not signalled and workflow is not None and self._shut_down(workflow):
                    process.send_signal(signal.SIGTERM)
                    signalled = True
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=1.0)
            for reader in readers:
                reader.join(timeout=30)
            self._processes.discard(process)
        code = process.returncode  # killed by signal N: 128 + N, as a container runtime reports it
        return (128 - code if code < 0 else code), b"".join(output).decode(errors="replace")

    def _shut_down(self, workflow: str) -> bool:
        obj = self._custom.get_namespaced_custom_object(*ARGO, self.namespace, "workflows", workflow)
        return bool((obj.get("spec") or {}).get("shutdown"))

    def _mounts(
        self, pod: client.V1Pod, main: client.V1Container, template: dict[str, Any], home: Path
    ) -> dict[str, Path]:
        """Each mount path of `main` (and each raw input artifact's path) -> its folder or file here."""
        volumes = {v.name: v for v in pod.spec.volumes or []}
        mounts: dict[str, Path] = {}
        for mount in main.volume_mounts or []:
            volume = volumes.get(mount.name)
            if volume is None or mount.mount_path.startswith("/var/run/"):
                continue
            if volume.persistent_volume_claim is not None:
                claim = self._core.read_namespaced_persistent_volume_claim(
                    volume.persistent_volume_claim.claim_name, self.namespace
                )
                source = Path(self._core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)
            elif volume.config_map is not None:
                data = self._core.read_namespaced_config_map(volume.config_map.name, self.namespace).data or {}
                source = _files(home / "volumes" / mount.name, data)
            elif volume.secret is not None:
                secret = self._core.read_namespaced_secret(volume.secret.secret_name, self.namespace)
                source = _files(home / "volumes" / mount.name, _decoded(secret.data or {}))
            else:  # emptyDir and the like: the pod's own folder
                source = home / "volumes" / mount.name
                source.mkdir(parents=True, exist_ok=True)
            mounts[mount.mount_path] = source / (mount.sub_path or "")
        for artifact in (template.get("inputs") or {}).get("artifacts") or []:
            if "raw" in artifact:
                path = home / "artifacts" / artifact["name"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(artifact["raw"]["data"])
                mounts[artifact["path"]] = path
        return mounts

    def _environment(self, main: client.V1Container, mounts: dict[str, Path]) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
        for var in main.env or []:
            if var.value is not None:
                env[var.name] = REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), _rewrite(var.value, mounts))
            elif var.value_from is not None and (value := self._value_from(var.value_from)) is not None:
                env[var.name] = _rewrite(value, mounts)
        env.pop("ARGO_TEMPLATE", None)
        return env

    def _value_from(self, source: client.V1EnvVarSource) -> str | None:
        try:
            if (ref := source.config_map_key_ref) is not None:
                return (self._core.read_namespaced_config_map(ref.name, self.namespace).data or {}).get(ref.key)
            if (ref := source.secret_key_ref) is not None:
                data = self._core.read_namespaced_secret(ref.name, self.namespace).data or {}
                return _decoded(data).get(ref.key)
        except client.ApiException as error:
            if error.status != 404:
                raise
        return None

    def _create_logs_object(self, pod: str, log: Path) -> None:
        body = {
            "apiVersion": "/".join(KWOK),
            "kind": "Logs",
            "metadata": {"name": pod},
            "spec": {"logs": [{"containers": ["main"], "logsFile": str(log), "follow": True}]},
        }
        self._custom.create_namespaced_custom_object(*KWOK, self.namespace, "logs", body)

    def _report(self, workflow: str, node_id: str, exit_code: int, result: str | None) -> None:
        """What argoexec's wait container writes when main ends: outputs, then the completed label."""
        owner = self._custom.get_namespaced_custom_object(*ARGO, self.namespace, "workflows", workflow)
        body = {
            "apiVersion": "/".join(ARGO),
            "kind": "WorkflowTaskResult",
            "metadata": {
                "name": node_id,
                "labels": {WORKFLOW_LABEL: workflow, "workflows.argoproj.io/report-outputs-completed": "true"},
                "ownerReferences": [
                    {
                        "apiVersion": "/".join(ARGO),
                        "kind": "Workflow",
                        "name": workflow,
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
            "outputs": {"exitCode": str(exit_code), **({"result": result} if result is not None else {})},
        }
        client.CustomObjectsApi(self.reporter).create_namespaced_custom_object(
            *ARGO, self.namespace, "workflowtaskresults", body
        )


def _rewrite(value: str, mounts: dict[str, Path]) -> str:
    """`value` with each mount path (at a path boundary) replaced by its folder here, in one pass (a
    folder here may itself start with a mount path, /tmp say)."""
    if not mounts:
        return value
    paths = "|".join(re.escape(path) for path in sorted(mounts, key=len, reverse=True))
    return re.sub(rf"(?<![\w.-])({paths})(?=/|$|\W)", lambda m: str(mounts[m.group(1)]), value)


def _files(folder: Path, data: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for key, text in data.items():
        (folder / key).write_text(text)
    return folder


def _decoded(data: dict[str, str]) -> dict[str, str]:
    import base64

    return {key: base64.b64decode(value).decode() for key, value in data.items()}
