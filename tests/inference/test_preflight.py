"""Before a model loads (issue 62): short names resolve to hub ids, an unreachable hub is said in one line,
and the memory estimate (train/memory.py) matches transformers' parameter counts and the peaks measured at
real model shapes (docs/results/real-shapes), and refuses what cannot fit with the command that does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo_suite.core.errors import UserError
from dapo_suite.core.ports import free_port
from dapo_suite.inference.hub import MODELS, hub_id, unknown_model_message
from dapo_suite.train.config import resolve_config
from dapo_suite.train.memory import adapter_parameter_count, check, estimate, parameter_count

REPO = Path(__file__).resolve().parents[2]
REAL_SHAPES = REPO / "docs" / "results" / "real-shapes"
# benchmarks/real_shapes.py's names -> the registry's
BENCHMARK_SHAPES = {
    "qwen2.5-0.5b": "Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen2.5-1.5B",
    "qwen3-0.6b": "Qwen3-0.6B",
    "qwen3-1.7b": "Qwen3-1.7B",
    "llama3.2-1b": "Llama-3.2-1B",
}
GIB = 2**30


def _train(
    *args: str, env: dict | None = None, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    return result, time.monotonic() - start


def test_short_names_resolve_to_hub_ids_in_any_case():
    assert hub_id("Qwen2.5-32B") == "Qwen/Qwen2.5-32B"
    assert hub_id("qwen3-8b-base") == "Qwen/Qwen3-8B-Base"
    assert hub_id("Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    assert hub_id("Llama-3-8B") == "meta-llama/Meta-Llama-3-8B"
    assert hub_id("DAPO-Qwen-32B") == "BytedTsinghua-SIA/DAPO-Qwen-32B"
    assert hub_id("someone/their-model") == "someone/their-model"
    with pytest.raises(UserError) as unknown:
        hub_id("Qwen2.5-33B")
    assert str(unknown.value) == unknown_model_message("Qwen2.5-33B")
    assert "; did you mean Qwen2.5-3B?)" in str(unknown.value)


def test_every_registered_shape_has_transformers_own_parameter_count():
    """The arithmetic against the model transformers builds from the same config fields (on the meta
    device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shapes = {json.dumps(shape, sort_keys=True): shape for _, shape in MODELS.values()}
    for shape in shapes.values():
        config = AutoConfig.for_model(**shape)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        assert parameter_count(shape) == sum(p.numel() for p in model.parameters()), shape


def _benchmark_runs():
    """(file, shape, mode, its benchmark's arguments, its result) of every committed step measurement."""
    for path in sorted(REAL_SHAPES.glob("*step*.json")):
        report = json.loads(path.read_text())
        for shape, entry in report["shapes"].items():
            for mode, result in entry["step"].items():
                if "peak_rss" in result:
                    yield path.name, shape, mode, report["args"], entry, result


def test_the_estimate_is_within_a_quarter_of_every_peak_measured_at_real_shapes():
    runs = list(_benchmark_runs())
    assert len(runs) >= 6
    for name, shape_name, mode, args, entry, result in runs:
        shape = MODELS[BENCHMARK_SHAPES[shape_name]][1]
        lora = mode == "lora"
        prompts = int(args["step_samples"]) // int(args["group_size"])
        # the benchmark's configuration (benchmarks/real_shapes.py step_config) on its CPU, with native bf16
        config = resolve_config(
            ["dapo"],
            {
                "model": BENCHMARK_SHAPES[shape_name],
                "train_batch_size": prompts,
                "mini_batch_size": prompts,
                "micro_batch_size": int(args["micro_batch"]),
                "group_size": int(args["group_size"]),
                "max_prompt_length": int(args["step_prompt_len"]),
                "max_response_length": int(args["step_tokens"]),
                "overlong_buffer_len": int(args["step_tokens"]) // 4,
                "dtype": "bfloat16" if lora else "float32",
                "lora_rank": int(args["lora_rank"]) if lora else 0,
                "lora_alpha": float(args["lora_alpha"]),
            },
        )
        found = estimate(config, shape)
        assert found.parameters == entry["params"], name
        assert found.trained == result["trainable_params"], name
        assert abs(found.update / result["peak_rss"] - 1) <= 0.25, (
            name,
            shape_name,
            mode,
            found.update,
            result["peak_rss"],
        )


def test_lora_adapters_count_only_the_targeted_layers():
    shape = MODELS["Qwen2.5-0.5B"][1]
    per_block_qv = 16 * ((896 + 896) + (896 + 128))  # q: 896 -> 14 x 64, v: 896 -> 2 x 64
    assert adapter_parameter_count(shape, 16, ["q_proj", "v_proj"]) == 24 * per_block_qv


def _config(model: str, *presets: str, **values):
    return resolve_config(list(presets), {"model": model, **values})


def test_what_cannot_fit_is_offered_the_least_change_that_does():
    machine = (20 * GIB, 24 * GIB)
    small = check(_config("embedded", "tiny-cpu"), MODELS["SmolLM2-135M-Instruct"][1], memory=machine)
    assert small.fits and small.fitting is None and small.verl is None
    # full fine-tuning of 1.5B parameters: float32 weights, gradients and AdamW state alone are 24.7 GB
    mid = check(_config("Qwen2.5-1.5B", "gsm8k-cpu"), MODELS["Qwen2.5-1.5B"][1], memory=machine)
    assert not mid.fits and mid.fitting["lora_rank"] == 16 and mid.verl is None
    assert (
        estimate(_config("Qwen2.5-1.5B", "gsm8k-cpu", **mid.fitting), MODELS["Qwen2.5-1.5B"][1]).peak
        <= machine[0]
    )
    big = check(_config("Qwen2.5-32B"), MODELS["Qwen2.5-32B"][1], memory=machine)
    assert (
        not big.fits and big.fitting is None and big.verl.flags == ["--nnodes", "2", "--gpus-per-node", "8"]
    )


def test_the_headline_command_answers_offline_in_seconds_with_the_memory_and_the_command_that_fits(tmp_path):
    """`dapo-suite train --model Qwen2.5-32B` on a machine without network (issue 62's definition of done)."""
    result, seconds = _train(
        "--model",
        "Qwen2.5-32B",
        "--out",
        str(tmp_path / "run"),
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert result.returncode == 1 and seconds < 10, (seconds, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 4 and not result.stdout, result.stderr
    assert lines[0] == "model: Qwen2.5-32B is Qwen/Qwen2.5-32B on the Hugging Face hub"
    assert "full fine-tuning of 32.76 B parameters needs about" in result.stderr
    assert "GiB available of" in result.stderr
    assert result.stderr.strip().endswith(
        f"dapo-suite train --model Qwen2.5-32B --out {tmp_path / 'run'} --backend "
        "verl --nnodes 2 --gpus-per-node 8 --train-file DATA.parquet"
    )
    assert "Traceback" not in result.stderr and "Retry" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "no network"])
def test_a_model_not_on_this_machine_says_what_to_download_in_one_line(offline, tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf")}
    if offline == "HF_HUB_OFFLINE":
        env["HF_HUB_OFFLINE"] = "1"
    else:  # a hub endpoint nothing listens on
        env.update(HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    result, seconds = _train(
        "--model",
        "Qwen2.5-0.5B-Instruct",
        "--preset",
        "tiny-cpu",
        "--set",
        "lora_rank=8",
        "--set",
        "micro_batch_size=1",
        "--out",
        str(tmp_path / "run"),
        env=env,
    )
    assert result.returncode == 1 and seconds < 30, (seconds, result.stderr)
    error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR" in error[0], (
        result.stderr
    )
    assert (
        "HF_HUB_OFFLINE is set" if offline == "HF_HUB_OFFLINE" else "no connection to 127.0.0.1"
    ) in error[0]
    assert "Retry" not in result.stderr and "Traceback" not in result.stderr


def test_an_unknown_short_name_gets_the_verl_dry_runs_message_on_both_backends(tmp_path):
    for backend in ("embedded", "verl"):
        result, _ = _train(
            "--model",
            "Qwen2.5-33B",
            "--backend",
            backend,
            "--out",
            str(tmp_path / backend),
            "--dry-run" if backend == "verl" else "--print-config",
        )
        assert result.returncode == 2 and unknown_model_message("Qwen2.5-33B") in result.stderr, result.stderr


def test_print_config_keeps_stdout_json_and_gives_the_estimate_on_stderr(tmp_path):
    result, _ = _train("--print-config", "--out", str(tmp_path / "run"))
    assert result.returncode == 0 and json.loads(result.stdout)["model"] == "embedded"
    assert result.stderr.startswith("memory: full fine-tuning of 0.13 B parameters needs about")
    assert "GiB available of" in result.stderr
    verl, _ = _train(
        "--print-config", "--backend", "verl", "--model", "Qwen2.5-32B", "--out", str(tmp_path / "v")
    )
    assert (
        "warning: memory: verl needs 16 GPUs of 80 GB" in verl.stderr and "this run asks for 8" in verl.stderr
    )


def test_a_run_beyond_this_machines_memory_is_refused_before_the_model_loads_unless_asked(tmp_path):
    """A 7B model's full fine-tuning needs over 100 GiB whatever the settings: refused with the LoRA command
    that fits, before anything is read or written; --no-memory-check lets it through to the loader (here: no
    weights)."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    args = [
        "--model",
        "Qwen2.5-7B",
        "--preset",
        "tiny-cpu",
        "--set",
        "micro_batch_size=1",
        "--out",
        str(tmp_path / "run"),
    ]
    refused, _ = _train(*args, env=env)
    assert refused.returncode == 1 and "full fine-tuning of 7.62 B parameters" in refused.stderr
    assert "It cannot fit here" in refused.stderr and not (tmp_path / "run").exists()
    let_through, _ = _train(*args, "--no-memory-check", env=env)
    assert let_through.returncode == 1 and "not in this machine's Hugging Face cache" in let_through.stderr
