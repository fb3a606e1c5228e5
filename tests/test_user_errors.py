"""Every bad input a user can give gets one clear message and a non-zero exit, never a traceback: the real
`dapo-suite` command in a subprocess per case (issue 18). Inputs are tiny, so most cases stop before torch
loads."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toy import TINY

from dapo_suite.core.ports import free_port
from dapo_suite.testing.scripted_server import ScriptedServer


def run_cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, what the message must say); files are made here, in the test's own directory."""
    (tmp / "no-tokenizer").mkdir()
    (tmp / "no-tokenizer" / "config.json").write_text("{}")
    fraction = [
        {"problem": "What is 1/2 + 1/4?", "answer": "\\frac34"},
        {"problem": "Halve 1.", "answer": "1/2"},
    ]
    no_retry = tmp / "no-retry.yaml"
    no_retry.write_text("max_retries: 0\nconcurrency: 1\n")
    llm = ["--rewriter", "llm", "--model", "m", "--config", str(no_retry), "--decontaminate", ""]
    return {
        "set_type_float": (["train", "--set", "lr=abc"], "--set lr=abc: lr takes a float"),
        "set_type_bool": (["train", "--set", "dynamic_sampling=maybe"], "dynamic_sampling takes true/false"),
        "set_range": (["train", "--set", "lr=-1"], "lr=-1.0: must be in (0, inf)"),
        "set_unknown": (["train", "--set", "clip_hi=0.3"], "unknown key 'clip_hi'"),
        "set_autocast": (
            ["train", "--set", "autocast_dtype=float8"],
            "autocast_dtype must be null (off), auto, bfloat16",
        ),
        "train_model_missing": (
            ["train", "--model", "/no/such/dir"],
            "--model /no/such/dir: no such directory",
        ),
        "train_malformed_line": (
            [
                "train",
                "--train-file",
                write_jsonl(tmp / "bad.jsonl", [{"problem": "What is 1+1?", "answer": "2"}, "{not json"]),
            ],
            "bad.jsonl line 2: not valid JSON",
        ),
        "train_no_answer": (
            [
                "train",
                "--train-file",
                write_jsonl(tmp / "noanswer.jsonl", [{"problem": "What is 1+1?", "solution": "2"}]),
            ],
            "noanswer.jsonl line 1: needs a problem",
        ),
        "eval_model_missing": (
            ["eval", "aime24", "--model", "/no/such/dir", "--out", str(tmp / "e1")],
            "--model /no/such/dir: no such directory",
        ),
        "eval_no_tokenizer": (
            ["eval", "aime24", "--model", str(tmp / "no-tokenizer"), "--out", str(tmp / "e2")],
            "has no tokenizer",
        ),
        "eval_empty_answer": (
            [
                "eval",
                "--file",
                write_jsonl(
                    tmp / "eval.jsonl",
                    [{"problem": "What is 1+1?", "answer": "2"}, {"problem": "What is 2+2?", "answer": " "}],
                ),
                "--out",
                str(tmp / "e3"),
            ],
            "eval.jsonl line 2: the answer (answer) is empty",
        ),
        "eval_max_retries": (
            ["eval", "aime24", "--endpoint", "http://127.0.0.1:1/v1", "--model", "m", "--max-retries", "-1"],
            "max_retries=-1: retries per request must be >= 0",
        ),
        "data_no_answer_field": (
            [
                "data",
                "build",
                "--input",
                write_jsonl(
                    tmp / "rows.jsonl",
                    [{"question": "What is 1+1?", "result": 2}, {"question": "What is 2+2?", "result": 4}],
                ),
                "--out",
                str(tmp / "d1"),
                "--decontaminate",
                "",
            ],
            "every one of the 2 input rows was rejected for the same reason",
        ),
        "data_max_tokens": (
            ["data", "build", "--input", "arithmetic", "--max-tokens", "0", "--out", str(tmp / "d2")],
            "max_tokens=0: must be in [1, inf)",
        ),
        "data_config_type": (
            [
                "data",
                "build",
                "--input",
                "arithmetic",
                "--config",
                str(no_retry.with_name("t.yaml")),
                "--out",
                str(tmp / "d3"),
            ],
            "concurrency=many: concurrency takes an integer",
        ),
        "data_llm_unreachable": (
            [
                "data",
                "build",
                "--input",
                write_jsonl(tmp / "frac.jsonl", fraction),
                *llm,
                "--base-url",
                f"http://127.0.0.1:{free_port()}/v1",
                "--out",
                str(tmp / "d4"),
            ],
            "all 2 LLM requests failed (model m); the last error: APIConnectionError",
        ),
    }


CASES = [
    "set_type_float",
    "set_type_bool",
    "set_range",
    "set_unknown",
    "set_autocast",
    "train_model_missing",
    "train_malformed_line",
    "train_no_answer",
    "eval_model_missing",
    "eval_no_tokenizer",
    "eval_empty_answer",
    "eval_max_retries",
    "data_no_answer_field",
    "data_max_tokens",
    "data_config_type",
    "data_llm_unreachable",
]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_gets_one_clear_message_and_no_traceback(case: str, tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("concurrency: many\n")
    args, message = _cases(tmp_path)[case]
    result = run_cli(args, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert message in output, output
    assert "Traceback" not in output and "unexpected" not in output, output


def test_llm_endpoint_failing_every_request_with_500_names_the_last_error(tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "frac.jsonl", [{"problem": "What is 1/2 + 1/4?", "answer": "\\frac34"}])
    (tmp_path / "c.yaml").write_text("max_retries: 1\n")
    with ScriptedServer(default="500") as server:
        result = run_cli(
            [
                "data",
                "build",
                "--input",
                rows,
                "--rewriter",
                "llm",
                "--model",
                "m",
                "--base-url",
                server.base_url,
                "--config",
                str(tmp_path / "c.yaml"),
                "--decontaminate",
                "",
                "--out",
                str(tmp_path / "out"),
            ],
            tmp_path,
        )
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "all 1 LLM requests failed" in output and "http_500" in output, output
    assert "Traceback" not in output


def test_llm_partial_failure_stops_unless_allowed(tmp_path: Path) -> None:
    rows = write_jsonl(
        tmp_path / "frac.jsonl",
        [{"problem": "What is 1/2 + 1/4?", "answer": "\\frac34"}, {"problem": "Halve 1.", "answer": "1/2"}],
    )
    (tmp_path / "c.yaml").write_text("max_retries: 0\nconcurrency: 1\n")
    base = [
        "data",
        "build",
        "--input",
        rows,
        "--rewriter",
        "llm",
        "--model",
        "m",
        "--config",
        str(tmp_path / "c.yaml"),
        "--decontaminate",
        "",
        "--out",
        str(tmp_path / "out"),
    ]
    reply = (
        '{"problem": "Find m+n.", "answer": 7, "form": "m/n", "params": {"m": 3, "n": 4}, "target": "m+n"}'
    )
    with ScriptedServer(script=["503"], reply=reply) as server:
        stopped = run_cli([*base, "--base-url", server.base_url], tmp_path)
    assert stopped.returncode != 0 and "1 of 2 LLM requests failed" in stopped.stderr + stopped.stdout
    assert "--max-failed-fraction 0.50" in stopped.stderr + stopped.stdout
    with ScriptedServer(
        script=["503"], reply=reply
    ) as server:  # the cached answer is reused; the failure repeats
        allowed = run_cli([*base, "--base-url", server.base_url, "--max-failed-fraction", "0.5"], tmp_path)
    output = allowed.stdout + allowed.stderr
    assert allowed.returncode == 0, output
    assert "1 of 2 LLM requests failed" in output and "llm_request_failed 1" in output


def _small_model(embedded: Path, target: Path) -> str:
    """A randomly initialised 2-layer model with the embedded model's tokenizer: another model, seconds to
    train."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(embedded)
    config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 64, 128
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(target)
    AutoTokenizer.from_pretrained(embedded).save_pretrained(target)
    return str(target)


def test_resume_into_a_run_of_another_model_says_which_model_wrote_it(
    tmp_path: Path, embedded_model_dir: Path
) -> None:
    from toy import TOY_FLAGS

    small, run = _small_model(embedded_model_dir, tmp_path / "small"), str(tmp_path / "run")
    first = run_cli(
        ["train", "--model", small, "--out", run, "--max-steps", "1", *TOY_FLAGS], tmp_path, timeout=600
    )
    assert first.returncode == 0, first.stdout + first.stderr
    # --resume takes the run's own model unless --model names another
    resumed = run_cli(
        ["train", "--resume", "--out", run, "--model", "embedded", "--max-steps", "2", *TOY_FLAGS],
        tmp_path,
        timeout=600,
    )
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode != 0, output
    assert "was written by another model" in output and "resume with that run's --model" in output, output
    assert "Traceback" not in output and "size mismatch" not in output, output


def test_a_bug_is_one_line_pointing_at_debug_and_debug_shows_its_traceback() -> None:
    """An unexpected exception (not a UserError) is a bug: one line naming it and `--debug`; with --debug the
    traceback. Driven through the real command group with one extra command that fails as a bug would."""
    from click.testing import CliRunner

    from dapo_suite.cli import main

    @main.command("explode")
    def explode() -> None:
        raise ZeroDivisionError("division by zero in a stage")

    try:
        plain = CliRunner().invoke(main, ["explode"])
        assert plain.exit_code == 1
        assert "unexpected ZeroDivisionError: division by zero in a stage" in plain.output, plain.output
        assert "rerun with `dapo-suite --debug ...`" in plain.output and "Traceback" not in plain.output
        debug = CliRunner().invoke(main, ["--debug", "explode"])
        assert isinstance(debug.exception, ZeroDivisionError)
    finally:
        main.commands.pop("explode")


FILE_SIZE_LIMIT = (
    20 * 2**20
)  # a file system that refuses files over 20 MB (RLIMIT_FSIZE), SIGXFSZ ignored: EFBIG


def _small_file_system() -> None:
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def test_a_rust_librarys_os_error_is_a_failure_of_the_machine_not_a_bug(tmp_path: Path) -> None:
    """safetensors (Rust) raises its own exception with `(os error N)` in the message, not an OSError; it is
    read as the errno it carries."""
    script = (
        "import torch; from safetensors.torch import save_file; from dapo_suite.cli import "
        "environment_errno\ntry:\n    save_file({'x': torch.zeros(2**23)}, 'big.safetensors')\nexcept "
        "Exception as error:\n    print(type(error).__name__, environment_errno(error))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_small_file_system,
    )
    assert result.stdout.split() == ["SafetensorError", str(errno.EFBIG)], result.stdout + result.stderr


@pytest.mark.slow  # one tiny training step
def test_a_checkpoint_the_file_system_refuses_is_reported_as_the_machines_failure_with_what_to_do(
    tmp_path: Path,
):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", "train", "--out", str(out), *TINY, "--max-steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_small_file_system,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "File too large" in result.stderr and "refuses a file this large" in result.stderr, result.stderr[
        -2000:
    ]
    assert "bug" not in result.stderr and "Traceback" not in result.stderr
    assert (out / "metrics.jsonl").is_file()  # what was written before stays
