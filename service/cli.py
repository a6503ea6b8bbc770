"""`foxhunt`: serve the controller, submit and follow jobs over the API, manage tokens in the DB."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

from service.domain import JobState
from service.settings import Settings

app = typer.Typer(help="foxhunt training-job controller.", no_args_is_help=True, add_completion=False)
jobs_app = typer.Typer(help="List, inspect, follow, cancel and retry jobs.", no_args_is_help=True)
token_app = typer.Typer(help="Create, list and revoke API tokens (talks to the database directly).")
app.add_typer(jobs_app, name="jobs")
app.add_typer(token_app, name="token")

ApiUrl = Annotated[str, typer.Option("--api-url", envvar="FOXHUNT_API_URL", help="Controller base URL.")]
Token = Annotated[str | None, typer.Option("--token", envvar="FOXHUNT_TOKEN", help="Bearer token.")]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
DEFAULT_URL = "http://127.0.0.1:8000"
_JOB_COLUMNS = ("id", "name", "state", "reason", "pool", "plan", "attempt", "created_at")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _client(api_url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=api_url, headers=headers, timeout=httpx.Timeout(30.0, read=None))


def _call(api_url: str, token: str | None, method: str, path: str, **kwargs: Any) -> Any:
    """One API call; a problem+json answer becomes a one-line error and exit code 1."""
    try:
        with _client(api_url, token) as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as error:
        raise _fail(f"cannot reach {api_url}: {error}") from None
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise _fail(f"{response.status_code}: {detail}")
    return response.json()


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    table = Table(*columns)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    Console(width=None if sys.stdout.isatty() else 200).print(table)  # pipes get whole ids


# Said beside a figure whose name alone misleads.
_NOTES = {"epoch_seconds": "  (projected: 2000 steps at the last reported step time, not the job's run time)"}


def _print_job(job: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(job, indent=2))
        return
    for key in (*_JOB_COLUMNS, "message", "phase", "step", "epoch_seconds", "started_at", "finished_at"):
        value = job.get(key)
        typer.echo(f"{key:>14}: {'' if value is None else value}{_NOTES.get(key, '') if value is not None else ''}")
    if job.get("breakdown_ms"):
        parts = " ".join(f"{k}={v:.3f}ms" for k, v in job["breakdown_ms"].items())
        typer.echo(f"{'breakdown':>14}: {parts}")
    _print_runs(job.get("runs") or [])
    for event in job.get("history", []):
        said = " ".join(part for part in (event.get("reason"), event.get("message")) if part)
        typer.echo(f"{'':>14}  {event['at']} {event['state']} {said}".rstrip())


def _figure(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _print_runs(runs: list[dict[str, Any]]) -> None:
    """A pack's runs, one line each: where every trial (or seed) of the pack stands, and which diverged."""
    if not runs:
        return
    typer.echo(f"{'runs':>14}: {'run':>3} {'seed':>6} {'trial':>5} {'step':>8} {'train':>9} {'eval':>9}")
    for run in runs:
        seed, trial = ("" if run.get(key) is None else run[key] for key in ("seed", "trial"))
        line = f"{run['run']:>3} {seed:>6} {trial:>5} {run['step']:>8}"
        line += f" {_figure(run.get('train_return')):>9} {_figure(run.get('eval_return')):>9}"
        typer.echo(f"{'':>14}  {line}{'  diverged (frozen)' if run.get('diverged') else ''}")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default FOXHUNT_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default FOXHUNT_PORT).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="API processes (default FOXHUNT_WORKERS, 1); the reconciler runs in one."),
    ] = None,
) -> None:
    """Run the controller (settings from FOXHUNT_* variables)."""
    import os
    import tempfile

    import uvicorn

    from service.app import create_app, freeze_startup_objects

    settings = Settings()
    host, port, workers = host or settings.host, port or settings.port, workers or settings.workers
    if workers == 1:
        controller = create_app(settings)
        freeze_startup_objects()
        uvicorn.run(controller, host=host, port=port, log_level="info")
        return
    # Several workers (service/workers.py): migrated once here, not by N processes at once; the reconciler's
    # lock file is this server's own unless set.
    if settings.migrate_on_start:
        from service.store import Store

        store = Store(settings.database_url)
        store.migrate()
        store.dispose()
    lock = settings.reconciler_lock_file or Path(tempfile.mkdtemp(prefix="foxhunt-serve-")) / "reconciler.lock"
    os.environ.update({"FOXHUNT_RECONCILER_LOCK_FILE": str(lock), "FOXHUNT_MIGRATE_ON_START": "0"})
    uvicorn.run(
        "service.app:app_from_environment", factory=True, workers=workers, host=host, port=port, log_level="info"
    )


@app.command()
def quickstart(
    config: Annotated[Path, typer.Option("--config", "-c", help="TrainConfig of the job.")] = Path(
        "examples/quickstart.yaml"
    ),
    workdir: Annotated[Path, typer.Option(help="SQLite database and job folders go here.")] = Path("runs/quickstart"),
) -> None:
    """The embedded default end to end: start the controller (local backend, SQLite, no tokens) in this
    process, submit a short job through the API, follow its log to the end and print its breakdown."""
    import socket
    import threading

    import uvicorn

    from service.app import create_app

    if not config.is_file():
        raise _fail(f"config file not found: {config}", 2)
    workdir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        database_url=f"sqlite:///{workdir.resolve() / 'foxhunt.db'}",
        jobs_dir=workdir / "jobs",
        auth_disabled=True,
        reconcile_interval_seconds=0.5,
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="controller", daemon=True)
    thread.start()
    api_url = f"http://127.0.0.1:{port}"
    try:
        while not server.started:
            if not thread.is_alive():
                raise _fail("the controller did not start")
            thread.join(0.05)
        typer.echo(f"controller listening on {api_url} (local backend, {settings.database_url})")
        body = {"config": yaml.safe_load(config.read_text()) or {}, "name": f"quickstart-{int(time.time())}"}
        job = _call(api_url, None, "POST", "/v1/jobs", json=body)
        typer.echo(f"submitted {job['id']} ({job['state']}); following its log")
        _stream_logs(api_url, None, job["id"])
        job = _call(api_url, None, "GET", f"/v1/jobs/{job['id']}")
        while not JobState(job["state"]).terminal:  # the log ends with the process; the state follows it
            time.sleep(0.2)
            job = _call(api_url, None, "GET", f"/v1/jobs/{job['id']}")
        typer.echo("")
        _print_job(job, as_json=False)
        if job["state"] != "SUCCEEDED":
            raise typer.Exit(1)
    finally:
        server.should_exit = True
        thread.join(10)


@app.command()
def submit(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TrainConfig YAML/JSON file.")] = None,
    pool: Annotated[str | None, typer.Option(help="GPU pool.")] = None,
    plan: Annotated[str | None, typer.Option(help="Execution plan.")] = None,
    model: Annotated[str | None, typer.Option(help="Model to train (dqn, the default).")] = None,
    epochs: Annotated[
        int | None, typer.Option(help="The run's length in epochs of 2000 steps; not with run.steps in the config.")
    ] = None,
    hyperopt_trials: Annotated[
        int | None,
        typer.Option(
            min=0, help="Hyper-parameter trials before the full run (0: none), on the local backend as on Argo."
        ),
    ] = None,
    space: Annotated[
        Path | None,
        typer.Option(
            help="The search's space, a YAML file: dotted.name -> {type, low, high, log, step, choices} (the "
            "config's search.space; default: the default space)."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name (also makes the submission idempotent).")] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Idempotency-Key.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="key=value, repeatable.")] = None,
    commit_sha: Annotated[str | None, typer.Option("--commit", help="Trainer commit sha.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream the log until the job ends.")] = False,
    api_url: ApiUrl = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Submit a job."""
    body: dict[str, Any] = {}
    if config is not None:
        if not config.is_file():
            raise _fail(f"config file not found: {config}", 2)
        body["config"] = yaml.safe_load(config.read_text()) or {}
    if space is not None:
        if not space.is_file():
            raise _fail(f"space file not found: {space}", 2)
        sections = body.setdefault("config", {})
        search = sections.setdefault("search", {}) if isinstance(sections, dict) else None
        if not isinstance(search, dict):
            raise _fail(f"--space: the config file {config} must be a mapping, its search section too", 2)
        search["space"] = yaml.safe_load(space.read_text())
    labels: dict[str, str] = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise _fail(f"label {item!r}: expected key=value", 2)
        labels[key] = value
    extra = {
        "pool": pool,
        "plan": plan,
        "model": model,
        "epochs": epochs,
        "hyperopt_trials": hyperopt_trials,
        "name": name,
        "commit_sha": commit_sha,
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    if labels:
        body["labels"] = labels
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    job = _call(api_url, token, "POST", "/v1/jobs", json=body, headers=headers)
    if as_json:
        typer.echo(json.dumps(job, indent=2))
    else:
        typer.echo(f"{job['id']} {job['state']}")
        if job.get("message"):
            typer.echo(f"note: {job['message']}")
    if follow:
        _stream_logs(api_url, token, job["id"])


@jobs_app.command("list")
def list_jobs(
    state: Annotated[str | None, typer.Option(help="Only this state.")] = None,
    pool: Annotated[str | None, typer.Option(help="Only this pool.")] = None,
    selector: Annotated[str | None, typer.Option("--selector", "-l", help="key=value[,key=value].")] = None,
    limit: Annotated[int, typer.Option(help="Page size.")] = 50,
    all_pages: Annotated[bool, typer.Option("--all", help="Follow every page.")] = False,
    api_url: ApiUrl = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first."""
    params: dict[str, Any] = {"limit": limit}
    params.update({k: v for k, v in {"state": state, "pool": pool, "label_selector": selector}.items() if v})
    items: list[dict[str, Any]] = []
    while True:
        page = _call(api_url, token, "GET", "/v1/jobs", params=params)
        items.extend(page["items"])
        if not all_pages or not page["next_cursor"]:
            break
        params["cursor"] = page["next_cursor"]
    if as_json:
        typer.echo(json.dumps(items, indent=2))
    else:
        _table(items, _JOB_COLUMNS)


@jobs_app.command("show")
def show(job_id: str, api_url: ApiUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False) -> None:
    """A job's state, history and last breakdown."""
    _print_job(_call(api_url, token, "GET", f"/v1/jobs/{job_id}"), as_json)


def _stream_logs(api_url: str, token: str | None, job_id: str, follow: bool = True) -> None:
    try:
        with (
            _client(api_url, token) as client,
            client.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": follow}) as response,
        ):
            if response.status_code >= 400:
                response.read()
                raise _fail(f"{response.status_code}: {response.json().get('detail', response.text)}")
            for chunk in response.iter_text():
                sys.stdout.write(chunk)
                sys.stdout.flush()
    except httpx.HTTPError as error:
        raise _fail(f"cannot reach {api_url}: {error}") from None


@jobs_app.command("logs")
def logs(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")] = False,
    api_url: ApiUrl = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Print a job's log."""
    _stream_logs(api_url, token, job_id, follow)


@jobs_app.command("cancel")
def cancel(job_id: str, api_url: ApiUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False) -> None:
    """Stop a job (graceful, then forced after the grace period)."""
    job = _call(api_url, token, "DELETE", f"/v1/jobs/{job_id}")
    typer.echo(json.dumps(job, indent=2) if as_json else f"{job['id']} {job['state']} (cancel requested)")


@jobs_app.command("retry")
def retry(job_id: str, api_url: ApiUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False) -> None:
    """Run a failed, cancelled or errored job again from its checkpoint."""
    job = _call(api_url, token, "POST", f"/v1/jobs/{job_id}/retry")
    typer.echo(json.dumps(job, indent=2) if as_json else f"{job['id']} {job['state']} (attempt {job['attempt']})")


def _store() -> Any:
    from service.store import Store

    store = Store(Settings().database_url)
    store.migrate()
    return store


@token_app.command("create")
def token_create(
    tenant: Annotated[
        str, typer.Option(help="Tenant the token acts for: a DNS label (lower-case letters, digits, '-').")
    ],
    name: Annotated[str, typer.Option(help="Who or what holds the token.")],
    admin: Annotated[bool, typer.Option(help="Sees and cancels every tenant's jobs.")] = False,
    as_json: AsJson = False,
) -> None:
    """Create a token; the secret is printed once and stored only as a hash."""
    from service.auth import create_token

    try:
        secret, info = create_token(_store(), name=name, tenant=tenant, admin=admin)
    except ValueError as error:
        raise _fail(str(error), 2) from None
    if as_json:
        typer.echo(json.dumps({"token": secret, **info.model_dump(mode="json")}, indent=2))
    else:
        typer.echo(secret)


@token_app.command("list")
def token_list(as_json: AsJson = False) -> None:
    """Tokens (never their secrets)."""
    rows = [t.model_dump(mode="json") for t in _store().list_tokens()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        _table(rows, ("id", "name", "tenant", "admin", "created_at", "revoked_at"))


@token_app.command("revoke")
def token_revoke(token_id: int) -> None:
    """Revoke a token by id; requests with it get 401 from then on."""
    if not _store().revoke_token(token_id):
        raise _fail(f"no live token with id {token_id}")
    typer.echo(f"revoked {token_id}")


def main() -> None:
    app()
