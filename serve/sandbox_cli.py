"""`dapo-suite sandbox`: run model-written Python in the sandbox the trainer's tool uses, once or as a
SandboxFusion-compatible server."""

from __future__ import annotations

import sys

import click

from dapo_suite.core.sandbox import SandboxLimits

_LIMITS = SandboxLimits()


def _limit_options(func):
    for name, kind, help_text in (
        ("wall-seconds", float, "Wall-time limit of a call; then its whole process tree is killed."),
        ("cpu-seconds", float, "CPU-time limit of a call (RLIMIT_CPU)."),
        ("memory-mb", int, "Address-space limit of a call (RLIMIT_AS), in MB."),
        ("output-bytes", int, "Limit of stdout and of stderr each; past it the call is stopped."),
    ):
        default = getattr(_LIMITS, name.replace("-", "_"))
        func = click.option(f"--{name}", type=kind, default=default, show_default=True, help=help_text)(func)
    return click.option(
        "--unsafe-no-isolation",
        is_flag=True,
        help="Run without bubblewrap's namespaces (rlimits only): the code can read your files, "
        "environment and network. Only where isolation cannot be installed.",
    )(func)


def _sandbox(options: dict, pool_size: int):
    from dapo_suite.core.sandbox import Sandbox

    limits = SandboxLimits(
        wall_seconds=options["wall_seconds"],
        cpu_seconds=options["cpu_seconds"],
        memory_mb=options["memory_mb"],
        output_bytes=options["output_bytes"],
    )
    return Sandbox(
        limits, pool_size=pool_size, isolation="unsafe-none" if options["unsafe_no_isolation"] else "bwrap"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def sandbox() -> None:
    """Run model-written Python in a fresh, isolated process: no network, no host files, environment or
    processes, a private /tmp, limits on time, memory, processes, file size and output (docs/tools.md).

    \b
        echo 'print(237 + 574)' | dapo-suite sandbox run -
        dapo-suite sandbox serve --port 8080      # SandboxFusion's POST /run_code
    """


@sandbox.command("run")
@click.argument("file", type=click.File("r"))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the whole record (outcome, exit status, output, "
    "time) as JSON instead of what the model would see.",
)
@_limit_options
def run(file, as_json: bool, **options) -> None:
    """Run FILE (- for standard input) once and print what the model would see; the exit status is the
    call's."""
    import json

    code = file.read()
    with _sandbox(options, pool_size=0) as box:
        result = box.run(code)
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else result.model_view())
    sys.exit(0 if result.outcome == "ok" else 1)


@sandbox.command("serve")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind; beyond loopback set --api-key."
)
@click.option("--port", default=8080, show_default=True, help="Port (SandboxFusion's default is 8080).")
@click.option(
    "--api-key",
    default=None,
    envvar="DAPO_SUITE_SANDBOX_API_KEY",
    help="Require `Authorization: Bearer KEY` (default: $DAPO_SUITE_SANDBOX_API_KEY).",
)
@click.option(
    "--max-concurrency",
    default=2,
    show_default=True,
    help="Calls run at once (the rest wait); about one per core.",
)
@_limit_options
def serve(host: str, port: int, api_key: str | None, max_concurrency: int, **options) -> None:
    """Serve SandboxFusion's `POST /run_code` (the `sandbox-fusion` client, verl tool configs written for
    it)."""
    import uvicorn

    from serve.auth import exposure_warning
    from serve.sandbox_api import make_app

    warning = exposure_warning(host, port, bool(api_key), "the sandbox", "--api-key")
    if warning:
        click.echo(warning.replace("use the model", "run code on this machine"), err=True)
    with _sandbox(options, pool_size=max_concurrency) as box:
        click.echo(f"sandbox: POST http://{host}:{port}/run_code ({max_concurrency} at once)", err=True)
        uvicorn.run(make_app(box, max_concurrency, api_key), host=host, port=port, log_level="warning")
