"""`dapo-suite serve`: the chat app (default) and `dapo-suite serve api` (the OpenAI-compatible endpoint
alone). Gradio, openai and the model server load only when a command runs."""

from __future__ import annotations

import functools

import click
from click.core import ParameterSource

from dapo_suite.core.cli_options import config_option, defaults_option, dtype_option, tools_option
from dapo_suite.core.fields import load_config
from serve.auth import API_KEY_ENV, exposure_warning
from serve.config import ENGINES, ServeConfig

_DEFAULTS = ServeConfig()


_MODEL_HELP = (
    "Checkpoint directory (`dapo-suite train` output), hub id, or `embedded` (default: the embedded "
    "SmolLM2-135M-Instruct)."
)


# A chat option with ServeConfig's default.
_default_option = functools.partial(defaults_option, _DEFAULTS)


def _model_option(extra: str = ""):
    return click.option("--model", default=None, metavar="PATH_OR_ID", help=_MODEL_HELP + extra)


def _engine_option(func):
    return click.option(
        "--engine",
        type=click.Choice(ENGINES),
        default="auto",
        show_default=True,
        help="Model server to start: vLLM when installed with a GPU (auto), else dapo-suite's sampler with "
        "continuous batching; `transformers` starts `transformers serve`.",
    )(func)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@_model_option(" With --endpoint: the served model name to request (default: the first one it lists).")
@click.option(
    "--endpoint",
    default=None,
    metavar="URL",
    help="Use a running OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1) instead of starting one.",
)
@_engine_option
@_default_option(
    "--host",
    help="Address the chat binds; 0.0.0.0 exposes it to your network (then set --auth or --auth-file).",
)
@_default_option("--port", help="Port of the chat app.")
@click.option(
    "--auth",
    default=None,
    metavar="USER:PASSWORD",
    help="Ask for this login before the chat opens (Gradio's login page). Visible in the process list: "
    "prefer --auth-file on a shared machine.",
)
@click.option(
    "--auth-file",
    default=None,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Logins the chat accepts, one user:password per line (blank lines and # comments skipped).",
)
@click.option(
    "--api-port", type=int, default=None, help="Port of the model server started for --model [default: free]."
)
@_default_option("--temperature", help="Initial temperature (DAPO: 1.0).")
@_default_option("--top-p", help="Initial top-p (DAPO: 0.7).")
@_default_option(
    "--max-tokens",
    help="Initial reply budget, in tokens: enough for a worked answer, short enough to wait for.",
)
@_default_option(
    "--concurrency",
    "concurrency_limit",
    help="Replies generated at once; others wait in the queue.",
)
@_default_option("--max-queue", help="Requests that may wait.")
@_default_option(
    "--max-prompt-chars",
    help="Longest question accepted.",
)
@_default_option(
    "--request-timeout",
    "request_timeout_s",
    help="Seconds a reply may stream before it is cut off.",
)
@_default_option(
    "--startup-timeout",
    "startup_timeout_s",
    help="Seconds the model server may take to become healthy.",
)
@tools_option(
    "Let the model run ```python blocks in the sandbox (docs/tools.md); each call and its output "
    "show folded in the reply, as Thinking does.",
)
@click.option(
    "--no-dapo-prompt",
    "dapo_prompt",
    flag_value=False,
    default=True,
    help="Start with the DAPO prompt checkbox off (questions are sent as typed).",
)
@config_option("ServeConfig")
@click.pass_context
def serve(ctx: click.Context, config_file: str | None, **options) -> None:
    """Chat with a trained reasoner in the browser, or serve it over an OpenAI-compatible API.

    \b
    Examples:
      dapo-suite serve                                   # chat with the embedded model at
      http://127.0.0.1:7860 dapo-suite serve --model runs/dapo/checkpoint-last # chat with a trained
      checkpoint dapo-suite serve --endpoint http://gpu-box:8000/v1 # chat through a server that is already
      running dapo-suite serve api --model runs/dapo/checkpoint-last --port 8000   # the endpoint alone

    The chat streams the reply, folds the reasoning into "Thinking", shows the final `Answer:` line (badge
    when it is an integer) and checks it when the question is an AIME 2024 problem. The model server
    (`vllm serve` on a GPU, dapo-suite's batched sampler on the CPU) is health-checked first and stopped with
    the app.
    """
    if ctx.invoked_subcommand is not None:
        return
    from serve.app import launch_app

    given = {k: v for k, v in options.items() if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    try:
        config = load_config(ServeConfig, config_file, given, "serve")
    except ValueError as error:
        raise click.BadParameter(str(error)) from error
    if warning := exposure_warning(
        config.host,
        config.port,
        bool(config.auth or config.auth_file),
        "the chat",
        "login: set --auth USER:PASSWORD or --auth-file FILE",
    ):
        click.echo(warning, err=True)
    launch_app(config)


@serve.command()
@_model_option()
@_engine_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address the API binds; 0.0.0.0 exposes it to your network (then set --api-key).",
)
@click.option("--port", type=int, default=8000, show_default=True, help="Port of the API (0: a free one).")
@click.option(
    "--api-key",
    default=None,
    envvar=API_KEY_ENV,
    show_envvar=True,
    metavar="KEY",
    help="Answer only requests that send `Authorization: Bearer KEY` (an OpenAI client's api_key); "
    "others get 401 in OpenAI's error shape before any work, as vLLM's --api-key. /health stays open.",
)
@click.option(
    "--max-prompt-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Longest prompt accepted, in tokens [default: the model's context minus the request's max_tokens].",
)
@_default_option(
    "--startup-timeout",
    "startup_timeout_s",
    help="Seconds the model server may take to become healthy.",
)
@dtype_option(
    "Precision of the model server. auto: bfloat16 where the CPU computes it natively (AVX-512 BF16), "
    "else float32; float32 gives the same greedy text on every CPU.",
)
@click.option(
    "--served-model-name",
    "served_name",
    default=None,
    metavar="NAME",
    help="The name /v1/models lists and requests send as `model` [default: SmolLM2-135M-Instruct for the "
    "embedded model, a checkpoint's folder name, a hub id as given]; the model's path is accepted too.",
)
def api(
    model: str | None,
    engine: str,
    host: str,
    port: int,
    api_key: str | None,
    max_prompt_tokens: int | None,
    startup_timeout_s: float,
    dtype: str,
    served_name: str | None,
) -> None:
    """Serve a model over an OpenAI-compatible API only (for `dapo-suite data` and `dapo-suite eval`).

    \b
    Prints the base URL, then serves until Ctrl-C or SIGTERM:
      dapo-suite serve api --model runs/dapo/checkpoint-last --port 8000
      dapo-suite eval aime24 --endpoint http://127.0.0.1:8000/v1 ...
      DAPO_SUITE_API_KEY=KEY dapo-suite serve api --host 0.0.0.0   # clients send api_key=KEY
    A prompt longer than the limit, or a max_tokens that is not a positive integer within the context, gets
    400 at once; a client that disconnects stops its generation; /v1/models lists the served model.
    On a CPU, concurrent requests are decoded together (continuous batching; docs/serve.md), so more streams
    share each step's weight reads (measured against other servers: docs/results/serve/).
    """
    from dapo_suite.core.ports import free_port
    from dapo_suite.inference.endpoint import EndpointError, start_endpoint
    from dapo_suite.inference.models import served_model_name
    from serve.api import serve_front
    from serve.app import stop_on_sigterm

    stop_on_sigterm()
    port = port or free_port(host)
    if warning := exposure_warning(
        host, port, bool(api_key), "serve api", f"API key: set --api-key or {API_KEY_ENV}"
    ):
        click.echo(warning, err=True)
    try:
        name = served_name or served_model_name(model)
        with start_endpoint(
            model, engine=engine, startup_timeout_s=startup_timeout_s, dtype=dtype, served_name=name
        ) as endpoint:

            def ready() -> None:
                click.echo(
                    f"OpenAI-compatible endpoint ready ({endpoint.engine}):\n  base URL: "
                    f"http://{host}:{port}/v1\n  model:    {name}\nCtrl-C stops it."
                )

            serve_front(
                endpoint.base_url,
                name,
                endpoint.model_path,
                host,
                port,
                max_prompt_tokens,
                on_ready=ready,
                engine=endpoint.engine,
                child_model=endpoint.model_name,
                api_key=api_key,
            )
            if endpoint.exit_code() is not None:
                raise click.ClickException(endpoint.diagnose())
    except KeyboardInterrupt:
        click.echo("Stopped.")
    except EndpointError as error:
        raise click.ClickException(str(error)) from None
