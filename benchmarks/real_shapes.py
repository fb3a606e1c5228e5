"""The sampler and the DAPO update at real model shapes: random weights at the public configs of
Qwen2.5-0.5B/1.5B, Qwen3-0.6B/1.7B and Llama-3.2-1B (their layer sizes, head layouts, RoPE settings and real
vocabulary sizes), so the figures are the ones those checkpoints would give without downloading them (cost
does not depend on the weights' values: every row decodes the same number of tokens).

    .venv/bin/python -m benchmarks.real_shapes                                  # all five shapes, both parts
    .venv/bin/python -m benchmarks.real_shapes --shapes qwen2.5-0.5b --parts step --modes full,lora
    .venv/bin/python -m benchmarks.real_shapes --shapes qwen2.5-1.5b --parts step --modes lora --json out.json
    # a smoke run of every code path (minutes, a few GB; its figures are no results):
    .venv/bin/python -m benchmarks.real_shapes --shapes smoke,qwen2.5-0.5b --rows 1,2 --tokens 8 \\
        --step-samples 4 --step-tokens 16 --group-size 4 --micro-batch 4 --modes lora

Parts (`--parts`):
- sampler: `sample_tokens` on random prompt ids (`--prompt-len` tokens each, drawn over the whole vocabulary)
  at each row count of `--rows` (one sample per prompt), exactly `--tokens` new tokens per row (an empty
  end-of-sequence set: no row stops early), against transformers' own step (`decoder="hf"`) on the same work.
  Both sides sample in `--dtype` (auto: bf16 where the CPU has native bf16, else float32; the model itself is
  built in that dtype so transformers' step runs in it too). The fast path's `StepperWeights` snapshot is made
  once before the timing (as `HFEngine` does between two policy updates; its seconds are printed). Per row
  count: one unmeasured warm-up call per side (2 tokens), then `--repeats` timed calls per side, taking turns,
  best kept. tok/s = rows x tokens / the call's wall time (prompt pass included). Printed beside each shape:
  whether the lean stepper takes it (`decoding.lean_refusal`) and on which path (fused kernels or torch ops).
- step: one DAPO policy update (`DAPOTrainer.actor.update`, the real trainer, its `dapo` preset: token-mean
  loss, clip 0.2/0.28, overlong filtering) over synthetic rollouts: `--step-samples` responses in groups of
  `--group-size` (one mini-batch: one AdamW step), prompts of `--step-prompt-len` random tokens, every
  response exactly `--step-tokens` tokens ending in end-of-sequence (none truncated, so all train), rewards
  +-1 mixed in every group; micro-batches of `--micro-batch`; a group's prompt runs once per micro-batch (the
  trainer's shared prompt). Weights as the trainer's `dtype: auto` loads them: float32 for full fine-tuning, a
  LoRA base in bf16 where the CPU has native bf16 (`--autocast bfloat16` for bf16 matmuls over float32 master
  weights). Modes (`--modes`): full fine-tuning, and LoRA (PEFT, rank `--lora-rank` 16, alpha `--lora-alpha`
  32, all linear layers). log pi_old comes from the trainer's own forward pass (`fill_old_log_probs`, timed
  apart); then `--step-warmup` unmeasured updates and `--step-reps` timed ones (median). The trainer's model
  loader is replaced by the random-weight model; the tokenizer (pad and end-of-sequence ids only) is the
  embedded model's.

Protocol: each (shape, part, mode) runs in a child process of its own (this file with `--worker`), so its peak
RSS (the child's ru_maxrss from wait4: model building included) is that configuration's alone, and one that
dies (out of memory) is reported, not fatal. Children run `--threads` threads (default: the cores this process
may use; DAPO_SUITE_THREADS is set, so the sampler does not adapt its thread count to other load). A
configuration whose estimated memory (the trainer's own preflight estimate of an update,
`dapo_suite.train.memory`: weights, gradients and AdamW state, one micro-batch's saved activations and logits)
exceeds `--memory-limit-gb` (default: the machine's total RAM) is skipped and said so. Seeded: weights
(`--seed`), prompts and rollouts.

Targets (printed as met / missed / not evaluated): every listed shape on the fast path at >= 2x transformers'
step at every row count; a LoRA DAPO step of the Qwen2.5-1.5B shape at 64 samples x 256 tokens under 12 GB
(12e9 bytes) peak RSS; LoRA's update >= 1.5x faster than full fine-tuning at Qwen2.5-0.5B.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RESULT = "REAL_SHAPES_RESULT "  # a worker's answer line (libraries may print their own lines to stdout)
QWEN_VOCAB, LLAMA_VOCAB = 151936, 128256
LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# The public configs' fields that set the cost (config.json of each checkpoint on the Hugging Face hub).
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": (
        "qwen2",
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=QWEN_VOCAB,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            use_sliding_window=False,
            hidden_act="silu",
        ),
    ),
    "qwen2.5-1.5b": (
        "qwen2",
        dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            vocab_size=QWEN_VOCAB,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=131072,
            use_sliding_window=False,
            hidden_act="silu",
        ),
    ),
    "qwen3-0.6b": (
        "qwen3",
        dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=QWEN_VOCAB,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
            attention_bias=False,
            use_sliding_window=False,
            hidden_act="silu",
        ),
    ),
    "qwen3-1.7b": (
        "qwen3",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=QWEN_VOCAB,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
            attention_bias=False,
            use_sliding_window=False,
            hidden_act="silu",
        ),
    ),
    "llama3.2-1b": (
        "llama",
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            vocab_size=LLAMA_VOCAB,
            rope_theta=500_000.0,
            rope_scaling=LLAMA3_ROPE_SCALING,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            max_position_embeddings=131072,
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
        ),
    ),
    # Not a public model: the Qwen3 block at a toy size with the real vocabulary, to check every code path in
    # seconds (`--shapes smoke`); never part of the default list or of a target.
    "smoke": (
        "qwen3",
        dict(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            vocab_size=QWEN_VOCAB,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
            attention_bias=False,
            use_sliding_window=False,
            hidden_act="silu",
        ),
    ),
}
PUBLIC_SHAPES = [name for name in SHAPES if name != "smoke"]
SAMPLER_TARGET, LORA_SPEEDUP_TARGET, LORA_RSS_TARGET = 2.0, 1.5, 12e9
LORA_RSS_SHAPE, LORA_SPEEDUP_SHAPE = "qwen2.5-1.5b", "qwen2.5-0.5b"


def model_config(shape: str):
    """The transformers config object of a shape (Qwen2Config, Qwen3Config or LlamaConfig)."""
    import transformers

    model_type, fields = SHAPES[shape]
    config_class = {
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "llama": transformers.LlamaConfig,
    }[model_type]
    return config_class(**fields)


def build_model(shape: str, dtype, seed: int):
    """A random-weight model of `shape` in `dtype` (transformers' own initialisation, seeded), attending with
    the project's grouped SDPA as `load_model_and_tokenizer` sets it."""
    import torch
    from transformers import AutoModelForCausalLM

    from dapo_suite.inference.models import GROUPED_SDPA, _register_grouped_sdpa

    _register_grouped_sdpa()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        model_config(shape), dtype=dtype, attn_implementation=GROUPED_SDPA
    )
    return model.eval()


def parameter_count(shape: str) -> int:
    """The shape's parameters (tied embeddings counted once), from a model built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(shape))
    return sum(p.numel() for p in model.parameters())


def step_config(job: dict, out: str):
    """The trainer's config of a step job: the `dapo` preset at the job's sizes, one mini-batch, weights as
    the trainer's `dtype: auto` loads them (a LoRA base in bf16 where native)."""
    from dapo_suite.inference.models import weights_dtype
    from dapo_suite.train.config import resolve_config

    lora = job["mode"] == "lora"
    prompts, tokens = job["samples"] // job["group_size"], job["tokens"]
    return resolve_config(
        ["dapo"],
        {
            "out": out,
            "model": f"random-weights:{job['shape']}",
            "seed": job["seed"],
            "train_batch_size": prompts,
            "mini_batch_size": prompts,
            "micro_batch_size": job["micro_batch"],
            "group_size": job["group_size"],
            "max_prompt_length": job["prompt_len"],
            "max_response_length": tokens,
            "overlong_buffer_len": max(1, tokens // 4),
            "warmup_steps": 0,
            "dtype": weights_dtype("auto", lora, "cpu"),
            "autocast_dtype": job["autocast"],
            "device": "cpu",
            "rollout_engine": "hf",
            "gradient_checkpointing": job["gradient_checkpointing"],
            "lora_rank": job["lora_rank"] if lora else 0,
            "lora_alpha": job["lora_alpha"],
            "lora_targets": "all-linear",
        },
    )


def estimated_bytes(job: dict) -> int:
    """The trainer's own estimate of one update's peak (`dapo_suite.train.memory`, no sampler: none runs
    here)."""
    from dapo_suite.train.memory import estimate

    model_type, fields = SHAPES[job["shape"]]
    return estimate(step_config(job, "unused"), {"model_type": model_type, **fields}).update


def peak_rss_self() -> int:
    """This process's peak resident set (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def sampling_dtype(name: str):
    import torch

    from dapo_suite.inference.models import resolve_precision

    resolved = resolve_precision(name, "cpu") if name == "auto" else name
    return getattr(torch, resolved or "float32")


# ---- the workers: one configuration each, one RESULT line back
# ---------------------------------------------------


def sampler_worker(job: dict) -> dict:
    """Fast path against transformers' step at each row count, on one random-weight model."""
    import torch

    from dapo_suite.inference.decoding import lean_refusal
    from dapo_suite.inference.fused_step import kernels
    from dapo_suite.inference.sampling import sample_tokens
    from dapo_suite.inference.weights import StepperWeights

    dtype = sampling_dtype(job["dtype"])
    model = build_model(job["shape"], dtype, job["seed"])
    refusal = lean_refusal(model)
    start = time.perf_counter()
    kernels()  # built or loaded once per process (a build lock may be waited on): not the snapshot's time
    kernels_seconds = time.perf_counter() - start
    start = time.perf_counter()
    weights = StepperWeights(model, dtype) if refusal is None else None
    snapshot_seconds = time.perf_counter() - start
    path = (
        "transformers' step (lean stepper refuses: " + refusal + ")"
        if refusal is not None
        else "lean stepper, fused kernels"
        if weights.kernels is not None
        else "lean stepper, torch ops"
    )
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(job["seed"] + 1)

    def call(decoder: str, ids: torch.Tensor, mask: torch.Tensor, tokens: int) -> float:
        begin = time.perf_counter()
        with torch.no_grad():
            batch = sample_tokens(
                model,
                ids,
                mask,
                tokens,
                1.0,
                1.0,
                set(),
                0,
                samples_per_prompt=1,
                generator=torch.Generator().manual_seed(job["seed"]),
                dtype=dtype,
                decoder=decoder,
                weights=weights if decoder == "auto" else None,
            )
        seconds = time.perf_counter() - begin
        assert int(batch.lengths.min()) == tokens, "a row stopped early"
        return seconds

    results = []
    for rows in job["rows"]:
        ids = torch.randint(0, vocab, (rows, job["prompt_len"]), generator=generator)
        mask = torch.ones_like(ids)
        seconds: dict[str, list[float]] = {"fast": [], "hf": []}
        sides = {"fast": "auto", "hf": "hf"}
        for (
            decoder
        ) in sides.values():  # warm-up: first-call costs (oneDNN primitives, allocations) off the clock
            call(decoder, ids, mask, 2)
        for _ in range(job["repeats"]):  # taking turns, so background load hits both alike
            for side, decoder in sides.items():
                seconds[side].append(call(decoder, ids, mask, job["tokens"]))
        best = {side: min(times) for side, times in seconds.items()}
        rates = {side: rows * job["tokens"] / best[side] for side in best}
        results.append(
            {
                "rows": rows,
                "seconds": seconds,
                "fast_tok_s": rates["fast"],
                "hf_tok_s": rates["hf"],
                "ratio": rates["fast"] / rates["hf"],
            }
        )
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "fast_path": refusal is None,
        "path": path,
        "kernels_seconds": kernels_seconds,
        "snapshot_seconds": snapshot_seconds,
        "rows": results,
    }


def step_worker(job: dict) -> dict:
    """One DAPO update (`DAPOTrainer.actor.update`) of a random-weight model, full fine-tuning or LoRA."""
    import torch
    from transformers import AutoTokenizer

    import dapo_suite.train.trainer as trainer_module
    from benchmarks.train_step import synthetic_groups
    from dapo_suite.inference.models import embedded_model_path

    weights = trainer_module.weights_dtype("auto", job["mode"] == "lora", "cpu")  # as the trainer loads them
    model = build_model(job["shape"], getattr(torch, weights), job["seed"])
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())  # pad and end-of-sequence ids only
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer_module.load_model_and_tokenizer = lambda *args, **kwargs: (model, tokenizer)
    samples, group, tokens = job["samples"], job["group_size"], job["tokens"]
    prompts = samples // group
    with tempfile.TemporaryDirectory() as tmp:
        config = step_config(job, tmp)
        trainer = trainer_module.DAPOTrainer(config)
        groups = synthetic_groups(
            prompts,
            group,
            job["prompt_len"],
            tokens,
            model.config.vocab_size,
            tokenizer.eos_token_id,
            job["seed"] + 2,
            min_response_len=tokens,
        )
        flat = [r for members in groups for r in members]
        start = time.perf_counter()
        trainer.fill_old_log_probs(flat)
        old_seconds = time.perf_counter() - start
        for _ in range(job["warmup"]):
            trainer.actor.update(groups)
        seconds = []
        for _ in range(job["reps"]):
            start = time.perf_counter()
            metrics = trainer.actor.update(groups)
            seconds.append(time.perf_counter() - start)
        trainer.logger.close()
    median = statistics.median(seconds)
    return {
        "trainable_params": sum(p.numel() for p in trainer.actor.trainable),
        "old_log_prob_seconds": old_seconds,
        "seconds": seconds,
        "update_seconds": median,
        "tokens": int(metrics["perf/trained_tokens"]),
        "tokens_per_s": metrics["perf/trained_tokens"] / median,
        "updates": int(metrics["actor/updates"]),
        "worker_peak_rss": peak_rss_self(),
    }


def worker_main(job: dict) -> None:
    import torch

    torch.set_num_threads(job["threads"])
    import transformers

    transformers.logging.set_verbosity_error()
    result = sampler_worker(job) if job["part"] == "sampler" else step_worker(job)
    result["worker_peak_rss"] = peak_rss_self()
    print(RESULT + json.dumps(result), flush=True)


# ---- the driver
# ---------------------------------------------------------------------------------------------------


def run_worker(job: dict, timeout: float) -> dict:
    """Run one configuration in a child; its RESULT, plus its peak RSS (ru_maxrss from wait4) and exit
    status."""
    environment = {
        **os.environ,
        "DAPO_SUITE_THREADS": str(job["threads"]),
        "OMP_NUM_THREADS": str(job["threads"]),
    }
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)],
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
    )
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    start = time.perf_counter()
    try:
        output = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        timer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    result: dict[str, Any] = {
        "returncode": process.returncode,
        "wall_seconds": time.perf_counter() - start,
        "peak_rss": usage.ru_maxrss * 1024,
    }
    answers = [line[len(RESULT) :] for line in output.splitlines() if line.startswith(RESULT)]
    if answers:
        result.update(json.loads(answers[-1]))
    else:
        why = (
            f"killed by signal {-process.returncode}"
            if process.returncode < 0
            else f"exit {process.returncode}"
        )
        result["error"] = f"no result ({why}; peak RSS {usage.ru_maxrss / 2**20:.2f} GiB)"
    return result


def gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def verdict(met: bool | None) -> str:
    return "not evaluated" if met is None else "met" if met else "missed"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        default=",".join(PUBLIC_SHAPES),
        help=f"comma list of {', '.join(SHAPES)} (smoke: a toy size, code paths only)",
    )
    parser.add_argument("--parts", default="sampler,step", help="comma list of sampler, step")
    parser.add_argument("--rows", default="1,64", help="sampler: rows decoded together (comma list)")
    parser.add_argument("--tokens", type=int, default=128, help="sampler: new tokens per row")
    parser.add_argument("--prompt-len", type=int, default=32, help="sampler: prompt tokens per row")
    parser.add_argument("--repeats", type=int, default=2, help="sampler: timed calls per side and row count")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="sampler: sampling dtype of both sides (auto: bf16 where native)",
    )
    parser.add_argument("--modes", default="full,lora", help="step: comma list of full, lora")
    parser.add_argument("--step-samples", type=int, default=64, help="step: responses in the mini-batch")
    parser.add_argument("--step-tokens", type=int, default=256, help="step: tokens per response")
    parser.add_argument("--step-prompt-len", type=int, default=64, help="step: prompt tokens per response")
    parser.add_argument("--group-size", type=int, default=8, help="step: responses per prompt")
    parser.add_argument("--micro-batch", type=int, default=8, help="step: responses per forward/backward")
    parser.add_argument("--step-warmup", type=int, default=1, help="step: unmeasured updates first")
    parser.add_argument("--step-reps", type=int, default=1, help="step: timed updates (median)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument(
        "--autocast", choices=["bfloat16"], help="step: bf16 autocast (float32 master weights)"
    )
    parser.add_argument("--gradient-checkpointing", action="store_true", help="step: recompute activations")
    parser.add_argument(
        "--memory-limit-gb",
        type=float,
        help="skip a step configuration whose estimated memory exceeds this (default: total RAM)",
    )
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads per child")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per child before it is killed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(json.loads(args.worker))
        return

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    for name, given, allowed in (
        ("--shapes", shapes, SHAPES),
        ("--parts", parts, ("sampler", "step")),
        ("--modes", modes, ("full", "lora")),
    ):
        unknown = [value for value in given if value not in allowed]
        if unknown:
            parser.error(f"{name}: unknown {', '.join(unknown)} (expected {', '.join(allowed)})")
    if args.step_reps < 1 or args.repeats < 1:
        parser.error("--step-reps and --repeats must be at least 1")
    if args.step_samples % args.group_size:
        parser.error(
            f"--step-samples ({args.step_samples}) must be a multiple of --group-size ({args.group_size})"
        )

    import torch
    import transformers

    from dapo_suite.core.provenance import cpu_line
    from dapo_suite.train.memory import device_memory

    limit = args.memory_limit_gb * 1e9 if args.memory_limit_gb else device_memory("cpu")[1]
    print(f"[real-shapes] {cpu_line()}")
    print(
        f"[real-shapes] torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} "
        f"threads per child, memory limit for a step {gib(limit)}"
    )
    common = {"seed": args.seed, "threads": args.threads}
    report: dict[str, Any] = {
        "cpu": cpu_line(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "shapes": {},
    }
    for shape in shapes:
        params = parameter_count(shape)
        entry: dict[str, Any] = {"params": params}
        report["shapes"][shape] = entry
        print(
            f"\n[{shape}] {SHAPES[shape][0]}, {params / 1e9:.3f} B parameters, vocabulary "
            f"{SHAPES[shape][1]['vocab_size']}"
        )
        if "sampler" in parts:
            job = {
                **common,
                "part": "sampler",
                "shape": shape,
                "rows": rows,
                "tokens": args.tokens,
                "prompt_len": args.prompt_len,
                "repeats": args.repeats,
                "dtype": args.dtype,
            }
            result = entry["sampler"] = run_worker(job, args.timeout)
            if "error" in result:
                print(f"[{shape}] sampler: {result['error']}")
            else:
                print(
                    f"[{shape}] sampler {result['dtype']}: {result['path']}; snapshot "
                    f"{result['snapshot_seconds']:.2f} s (kernels loaded in {result['kernels_seconds']:.2f} "
                    f"s); child peak RSS {gib(result['peak_rss'])}"
                )
                for row in result["rows"]:
                    print(
                        f"[{shape}]   {row['rows']:>3} rows x {args.tokens} tokens: fast "
                        f"{row['fast_tok_s']:8.1f} "
                        f"tok/s, transformers {row['hf_tok_s']:8.1f} tok/s, ratio {row['ratio']:.2f}x"
                    )
        if "step" in parts:
            entry["step"] = {}
            for mode in modes:
                job = {
                    **common,
                    "part": "step",
                    "shape": shape,
                    "mode": mode,
                    "samples": args.step_samples,
                    "tokens": args.step_tokens,
                    "prompt_len": args.step_prompt_len,
                    "group_size": args.group_size,
                    "micro_batch": args.micro_batch,
                    "warmup": args.step_warmup,
                    "reps": args.step_reps,
                    "lora_rank": args.lora_rank,
                    "lora_alpha": args.lora_alpha,
                    "autocast": args.autocast,
                    "gradient_checkpointing": args.gradient_checkpointing,
                }
                estimate = estimated_bytes(job)
                if estimate > limit:
                    entry["step"][mode] = {"skipped": f"estimated {gib(estimate)} > limit {gib(limit)}"}
                    print(
                        f"[{shape}] step {mode}: skipped, estimated memory {gib(estimate)} exceeds "
                        f"{gib(limit)}"
                    )
                    continue
                result = entry["step"][mode] = run_worker(job, args.timeout)
                result["estimated_bytes"] = estimate
                if "error" in result:
                    print(f"[{shape}] step {mode}: {result['error']}")
                    continue
                print(
                    f"[{shape}] step {mode:<4}: {args.step_samples} x {args.step_tokens} tokens, update "
                    f"{result['update_seconds']:.2f} s ({result['tokens_per_s']:,.0f} tok/s, "
                    f"{result['trainable_params'] / 1e6:.1f} M trainable), old log-probs "
                    f"{result['old_log_prob_seconds']:.2f} s; peak RSS {gib(result['peak_rss'])} "
                    f"(estimated {gib(estimate)})"
                )
            done = {m: r for m, r in entry["step"].items() if "update_seconds" in r}
            if len(done) == 2:
                entry["lora_speedup"] = done["full"]["update_seconds"] / done["lora"]["update_seconds"]
                print(f"[{shape}] LoRA update {entry['lora_speedup']:.2f}x faster than full fine-tuning")

    report["targets"] = targets(report, shapes, parts, args)
    print()
    for name, (met, detail) in report["targets"].items():
        print(f"[target] {name}: {verdict(met)} ({detail})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"[real-shapes] wrote {args.json}")


def targets(
    report: dict, shapes: list[str], parts: list[str], args: argparse.Namespace
) -> dict[str, tuple[bool | None, str]]:
    """Each target: met (True), missed (False) or not evaluated (None: the run did not measure what it
    needs)."""
    result: dict[str, tuple[bool | None, str]] = {}
    sampled = [s for s in shapes if s in PUBLIC_SHAPES and "sampler" in report["shapes"][s]]
    if "sampler" not in parts or not sampled:
        result["fast path >= 2x transformers' step"] = (None, "no public shape sampled")
    else:
        worst = []
        met = True
        for shape in sampled:
            sampler = report["shapes"][shape]["sampler"]
            if "error" in sampler:
                met = False
                worst.append(f"{shape} failed")
                continue
            ratio = min(row["ratio"] for row in sampler["rows"])
            met = met and sampler["fast_path"] and ratio >= SAMPLER_TARGET
            worst.append(f"{shape} {'fast' if sampler['fast_path'] else 'NOT fast'} min {ratio:.2f}x")
        missing = [s for s in PUBLIC_SHAPES if s not in sampled]
        note = f"; not sampled: {', '.join(missing)}" if missing else ""
        result["fast path >= 2x transformers' step"] = (
            met if not missing or not met else None,
            "; ".join(worst) + note,
        )
    step = report["shapes"].get(LORA_RSS_SHAPE, {}).get("step", {}).get("lora")
    name = f"LoRA step {LORA_RSS_SHAPE} 64x256 < 12 GB RSS"
    if args.step_samples != 64 or args.step_tokens != 256:
        result[name] = (
            None,
            f"run at {args.step_samples} x {args.step_tokens}, needs --step-samples 64 --step-tokens 256",
        )
    elif step is None or "skipped" in step:
        result[name] = (None, f"{LORA_RSS_SHAPE} LoRA step not run")
    else:
        result[name] = (
            step["peak_rss"] < LORA_RSS_TARGET,
            f"peak RSS {step['peak_rss'] / 1e9:.2f} GB" + (f", {step['error']}" if "error" in step else ""),
        )
    speedup = report["shapes"].get(LORA_SPEEDUP_SHAPE, {}).get("lora_speedup")
    name = f"LoRA update >= 1.5x faster than full at {LORA_SPEEDUP_SHAPE}"
    result[name] = (
        (None, f"needs both modes of {LORA_SPEEDUP_SHAPE}")
        if speedup is None
        else (speedup >= LORA_SPEEDUP_TARGET, f"{speedup:.2f}x")
    )
    return result


if __name__ == "__main__":
    main()
