"""The verl backend: a TrainConfig becomes the Hydra override list of `python -m verl.trainer.main_ppo`.

    dapo-suite train --backend verl --preset dapo --model Qwen/Qwen2.5-32B --nnodes 16 --gpus-per-node 8 \
        --train-file dapo-math-17k.parquet --out runs/dapo-32b --dry-run

One table (`VERL_KEYS`) maps every TrainConfig field that verl has a knob for onto verl 0.9.1's Hydra key(s) and a
converter; the embedded trainer reads the same fields, so a preset (`grpo` ... `dapo`) means the same on both.
Then come the paper's constants (`PAPER_CONSTANTS`: GRPO advantage, no KL, reward manager `dapo`, our
`compute_score`), the hardware keys (`hardware_overrides`), and raw `verl.<key>=value` passthroughs last.

Before anything starts, `validate` composes the list with verl's packaged Hydra config (unknown keys fail there),
checks value types against verl's defaults, runs verl's own `validate_config`, and checks the resource arithmetic
(data-parallel divisibility, TP/SP vs GPUs, token budget per GPU) and that model and data exist.

verl 0.9.1 traps handled here (see docs/train-at-scale.md):
- the soft overlong penalty lives in `reward.reward_kwargs.overlong_buffer_cfg` (+ `max_resp_len`), keys verl's
  schema does not declare (hence the `+` prefix); the recipe's `reward_model.overlong_buffer.*` are ignored;
- `algorithm.filter_groups.metric` defaults to `reward` (includes the overlong penalty): the paper filters on acc;
- the default V1 trainer (`trainer.use_v1=True`) filters groups in its replay buffer and ignores
  `max_num_gen_batches` (it keeps sampling until the batch is full);
- overlong filtering does not exist in verl: `dapo_suite.verl_extensions` registers it as a policy loss.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_suite.config import TrainConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
REWARD_FILE = Path(__file__).resolve().parent / "reward.py"
AIME24_JSONL = REPO_ROOT / "eval" / "benchmarks" / "aime24.jsonl"
EXTENSION_MODULE = "dapo_suite.verl_extensions"
OVERLONG_FILTER_LOSS = "dapo_overlong_filter"  # verl_extensions registers it (that module imports verl)
ROLLOUT_CORRECTION = "algorithm.rollout_correction"
# verl types these str | float: a "lower_upper" threshold is a string where verl's default is a number
UNION_TYPED_KEYS = (f"{ROLLOUT_CORRECTION}.rollout_is_threshold", f"{ROLLOUT_CORRECTION}.rollout_rs_threshold")
MAX_RESPONSE_LENGTH_ENV = "DAPO_SUITE_MAX_RESPONSE_LENGTH"
ENTRY_POINT = [sys.executable, "-m", "verl.trainer.main_ppo"]
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
OVERLONG = "+reward.reward_kwargs.overlong_buffer_cfg"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class VerlConfigError(ValueError):
    """The override list would not run: the message says what to change."""


def _same(value: Any, config: TrainConfig) -> Any:
    return value


def overlong_filter_loss_name(loss_mode: str) -> str:
    """The name verl_extensions registers for `loss_mode` restricted to non-truncated responses."""
    return OVERLONG_FILTER_LOSS if loss_mode == "vanilla" else f"{OVERLONG_FILTER_LOSS}_{loss_mode}"


def _corrects(config: TrainConfig) -> bool:
    return config.rollout_correction != "off"


def _number(threshold: str | None) -> float | str | None:
    """A threshold as verl reads it: a number when it is one, else the "lower_upper" string."""
    try:
        return None if threshold is None else float(threshold)
    except ValueError:
        return threshold


@dataclass(frozen=True)
class VerlKey:
    """One row of the table: a TrainConfig field, the verl key(s) it sets, and how its value converts."""

    field: str
    keys: tuple[str, ...]
    convert: Callable[[Any, TrainConfig], Any] = _same


# TrainConfig field -> verl 0.9.1 Hydra key(s). A leading "+" adds a key verl's schema does not declare.
VERL_KEYS: tuple[VerlKey, ...] = (
    VerlKey("model", ("actor_rollout_ref.model.path",), lambda v, c: _model_path(v)),
    VerlKey("train_file", ("data.train_files",)),
    VerlKey("val_file", ("data.val_files",)),
    VerlKey("seed", ("data.seed",)),
    # rollout
    VerlKey("train_batch_size", ("data.train_batch_size",)),
    # Without dynamic sampling a generation batch is the training batch.
    VerlKey("gen_batch_size", ("data.gen_batch_size",),
            lambda v, c: v if c.dynamic_sampling else c.train_batch_size),
    VerlKey("group_size", (f"{ROLLOUT}.n",)),
    VerlKey("max_prompt_length", ("data.max_prompt_length",)),
    VerlKey("max_response_length", ("data.max_response_length", "+reward.reward_kwargs.max_resp_len")),
    # L_max for the overlong-filter loss in every Ray worker (Ray wants env values as strings)
    VerlKey("max_response_length", (f"+ray_kwargs.ray_init.runtime_env.env_vars.{MAX_RESPONSE_LENGTH_ENV}",),
            lambda v, c: str(v)),
    VerlKey("temperature", (f"{ROLLOUT}.temperature",)),
    VerlKey("top_p", (f"{ROLLOUT}.top_p",)),
    VerlKey("rollout_engine", (f"{ROLLOUT}.name",), lambda v, c: "vllm" if v == "auto" else v),
    # the DAPO switches
    VerlKey("dynamic_sampling", ("algorithm.filter_groups.enable",)),
    # our "score" (correctness + overlong penalty) is verl's canonical "reward"; "acc" is compute_score's acc
    VerlKey("filter_metric", ("algorithm.filter_groups.metric",), lambda v, c: "reward" if v == "score" else v),
    VerlKey("max_num_gen_batches", ("algorithm.filter_groups.max_num_gen_batches",)),
    VerlKey("clip_low", (f"{ACTOR}.clip_ratio_low",)),
    VerlKey("clip_high", (f"{ACTOR}.clip_ratio_high",)),
    # verl always applies dual-clip; "off" is a bound no ratio reaches
    VerlKey("clip_c", (f"{ACTOR}.clip_ratio_c",), lambda v, c: 1e9 if v is None else v),
    VerlKey("loss_agg", (f"{ACTOR}.loss_agg_mode",)),
    VerlKey("overlong_penalty", (f"{OVERLONG}.enable",)),
    VerlKey("overlong_buffer_len", (f"{OVERLONG}.len",)),
    VerlKey("overlong_penalty_factor", (f"{OVERLONG}.penalty_factor",)),
    # the objective; with overlong filtering, verl_extensions' wrapper of the same loss
    VerlKey("loss_mode", (f"{ACTOR}.policy_loss.loss_mode",),
            lambda v, c: overlong_filter_loss_name(v) if c.overlong_filter else v),
    *(VerlKey(name, (f"{ACTOR}.policy_loss.{name}",))
      for name in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")),
    VerlKey("tau_pos", (f"{ACTOR}.tau_pos",)),
    VerlKey("tau_neg", (f"{ACTOR}.tau_neg",)),
    VerlKey("adv_estimator", ("algorithm.adv_estimator",)),
    # only grpo and grpo_passk read it; verl has no batch-level std (input_problems says so)
    VerlKey("adv_norm", ("algorithm.norm_adv_by_std_in_grpo",), lambda v, c: v != "none"),
    # rollout correction: verl samples with vLLM and trains with FSDP, so "auto" is on
    VerlKey("rollout_is", (f"{ROLLOUT_CORRECTION}.rollout_is",), lambda v, c: v if _corrects(c) else None),
    VerlKey("rollout_is_threshold", (f"{ROLLOUT_CORRECTION}.rollout_is_threshold",), lambda v, c: _number(v)),
    VerlKey("rollout_is_batch_normalize", (f"{ROLLOUT_CORRECTION}.rollout_is_batch_normalize",)),
    VerlKey("rollout_rs", (f"{ROLLOUT_CORRECTION}.rollout_rs",), lambda v, c: v if _corrects(c) else None),
    VerlKey("rollout_rs_threshold", (f"{ROLLOUT_CORRECTION}.rollout_rs_threshold",), lambda v, c: _number(v)),
    # optimisation
    VerlKey("lr", (f"{ACTOR}.optim.lr",)),
    VerlKey("warmup_steps", (f"{ACTOR}.optim.lr_warmup_steps",)),
    VerlKey("weight_decay", (f"{ACTOR}.optim.weight_decay",)),
    # the legacy worker reads actor.grad_clip, the engine workers optim.clip_grad
    VerlKey("grad_clip", (f"{ACTOR}.grad_clip", f"{ACTOR}.optim.clip_grad")),
    VerlKey("mini_batch_size", (f"{ACTOR}.ppo_mini_batch_size",)),
    VerlKey("ppo_epochs", (f"{ACTOR}.ppo_epochs",)),
    # budget, validation, checkpoints
    VerlKey("max_steps", ("trainer.total_training_steps",)),
    VerlKey("eval_every", ("trainer.test_freq",), lambda v, c: v if v > 0 else -1),
    VerlKey("val_n", (f"{ROLLOUT}.val_kwargs.n",)),
    VerlKey("val_temperature", (f"{ROLLOUT}.val_kwargs.temperature",)),
    VerlKey("val_top_p", (f"{ROLLOUT}.val_kwargs.top_p",)),
    VerlKey("save_every", ("trainer.save_freq",)),
    VerlKey("keep_checkpoints", ("trainer.max_actor_ckpt_to_keep",)),
    VerlKey("wandb_project", ("trainer.project_name",), lambda v, c: v or "dapo-suite"),
)

# Fields verl has no knob for (or that only the embedded trainer uses), with the reason; a test checks that every
# TrainConfig field is either in VERL_KEYS or here.
NOT_MAPPED = {
    "task": "built-in task of the embedded trainer; verl needs --train-file",
    "heldout_size": "embedded trainer only",
    "rollout_gpu_memory_utilization": "embedded trainer only; verl: --gpu-memory-utilization (Hardware)",
    "sampling_dtype": "embedded trainer only; verl samples with vLLM in actor_rollout_ref.rollout.dtype",
    "backend": "selects this module",
    "reuse_surplus_groups": "verl's V1 replay buffer decides (surplus groups are discarded, counted in metrics)",
    "micro_batch_size": "verl packs micro-batches by tokens (use_dynamic_bsz); see hardware_overrides",
    "val_max_response_length": "verl validates with data.max_response_length; must be unset or equal",
    "dtype": "verl trains in bf16 mixed precision with fp32 master weights (fsdp_config.dtype)",
    "device": "verl uses the GPUs Ray gives it",
    "presets": "record only",
    "out": "run_dir_overrides: trainer.default_local_dir=OUT/checkpoints, trainer.experiment_name=basename",
    "overlong_filter": "selects the overlong-filter wrapper of loss_mode (see the loss_mode row)",
    "rollout_correction": "on or off through rollout_is / rollout_rs (null = off); auto is on (vLLM vs FSDP)",
}

# The paper's run, fixed whatever the preset (reference doc section 2).
PAPER_CONSTANTS: tuple[tuple[str, Any], ...] = (
    ("algorithm.use_kl_in_reward", False),
    ("algorithm.kl_ctrl.kl_coef", 0.0),
    (f"{ACTOR}.use_kl_loss", False),
    (f"{ACTOR}.kl_loss_coef", 0.0),
    (f"{ACTOR}.entropy_coeff", 0),
    (f"{ACTOR}.optim.lr_scheduler_type", "constant"),
    (f"{ROLLOUT}.val_kwargs.do_sample", True),
    (f"{ROLLOUT}.val_kwargs.top_k", -1),
    (f"{ROLLOUT}.top_k", -1),
    ("reward.reward_manager.name", "dapo"),
    ("reward.custom_reward_function.path", str(REWARD_FILE)),
    ("reward.custom_reward_function.name", "compute_score"),
    (f"{OVERLONG}.log", False),
    ("actor_rollout_ref.model.external_lib", EXTENSION_MODULE),
    ("actor_rollout_ref.model.use_remove_padding", True),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
    ("data.prompt_key", "prompt"),
    ("data.truncation", "left"),
    ("data.filter_overlong_prompts", True),
    ("trainer.val_before_train", True),
    ("trainer.resume_mode", "auto"),
    ("trainer.logger", ["console", "tensorboard"]),
)


@dataclass(frozen=True)
class Hardware:
    """Where and how verl runs. None = auto: the 32B recipe's values capped by the GPUs at hand."""

    nnodes: int = 1
    gpus_per_node: int = 8
    rollout_tp: int | None = None  # vLLM tensor parallel (recipe: 4)
    ulysses_sp: int | None = None  # Ulysses sequence parallel of the actor (recipe: 8)
    offload: bool | None = None  # FSDP param + optimizer offload to host memory (recipe: on)
    gpu_memory_utilization: float = 0.8  # vLLM's share of GPU memory (recipe: 0.80)
    ray_address: str | None = None  # submit to this cluster with `ray job submit` instead of a local Ray

    @property
    def gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def tp(self) -> int:
        return self.rollout_tp if self.rollout_tp is not None else min(4, self.gpus_per_node)

    @property
    def sp(self) -> int:
        return self.ulysses_sp if self.ulysses_sp is not None else min(8, self.gpus)

    @property
    def offloads(self) -> bool:
        return self.offload if self.offload is not None else self.gpus >= 8


def hardware_overrides(config: TrainConfig, hw: Hardware) -> list[tuple[str, Any]]:
    """GPUs, parallelism, offload and token budgets (the recipe's: dynamic batch of prompt+response tokens)."""
    tokens = config.max_prompt_length + config.max_response_length
    return [
        ("trainer.nnodes", hw.nnodes),
        ("trainer.n_gpus_per_node", hw.gpus_per_node),
        (f"{ROLLOUT}.tensor_model_parallel_size", hw.tp),
        (f"{ROLLOUT}.gpu_memory_utilization", hw.gpu_memory_utilization),
        (f"{ROLLOUT}.enable_chunked_prefill", True),
        (f"{ROLLOUT}.max_num_batched_tokens", tokens),
        (f"{ACTOR}.ulysses_sequence_parallel_size", hw.sp),
        ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", hw.sp),
        (f"{ACTOR}.fsdp_config.param_offload", hw.offloads),
        (f"{ACTOR}.fsdp_config.optimizer_offload", hw.offloads),
        ("actor_rollout_ref.ref.fsdp_config.param_offload", hw.offloads),
        (f"{ACTOR}.fsdp_config.fsdp_size", -1),
        (f"{ACTOR}.use_dynamic_bsz", True),
        ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", True),
        (f"{ROLLOUT}.log_prob_use_dynamic_bsz", True),
        (f"{ACTOR}.ppo_max_token_len_per_gpu", tokens),
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", tokens),
        (f"{ROLLOUT}.log_prob_max_token_len_per_gpu", tokens),
    ]


def run_dir_overrides(config: TrainConfig) -> list[tuple[str, Any]]:
    run_dir = Path(config.out).resolve()
    return [("trainer.default_local_dir", str(run_dir / "checkpoints")),
            ("trainer.experiment_name", run_dir.name),
            ("trainer.rollout_data_dir", None),
            ("trainer.validation_data_dir", str(run_dir / "validation"))]


def _model_path(model: str) -> str:
    if model in (None, "embedded"):
        from dapo_suite.models import embedded_model_path

        return str(embedded_model_path())
    return str(Path(model).expanduser().resolve()) if Path(model).expanduser().exists() else model


def hydra_value(value: Any) -> str:
    """A Python value as Hydra override syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    reads_as_other = re.fullmatch(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?|true|false|null|", text, re.I)
    if re.fullmatch(r"[\w./~:@+-]*", text) and not reads_as_other:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_overrides(config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The full override list: table, paper constants, hardware, run directory, then raw passthroughs."""
    pairs: list[tuple[str, Any]] = []
    for row in VERL_KEYS:
        value = row.convert(getattr(config, row.field), config)
        pairs += [(key, value) for key in row.keys]
    pairs += list(PAPER_CONSTANTS) + hardware_overrides(config, hw) + run_dir_overrides(config)
    overrides = {key: f"{key}={hydra_value(value)}" for key, value in pairs}
    for raw in passthrough:
        if "=" not in raw:
            raise VerlConfigError(f"--set verl.{raw!r}: expected verl.<hydra.key>=value")
        key = raw.split("=", 1)[0]
        plain = key.lstrip("+~")
        # a passthrough replaces the generated value of the same key (Hydra rejects a key given twice)
        for existing in [k for k in overrides if k.lstrip("+") == plain]:
            del overrides[existing]
        overrides[key] = raw
    return list(overrides.values())


def command(overrides: list[str], hw: Hardware, run_dir: Path | None = None) -> list[str]:
    """The argv that starts the run: in-process local Ray, or `ray job submit` to `hw.ray_address`.

    Hydra's own log goes to RUN_DIR/hydra instead of ./outputs/DATE (not part of the validated overrides)."""
    if run_dir is not None:
        overrides = [*overrides, f"hydra.run.dir={hydra_value(str(Path(run_dir).resolve() / 'hydra'))}"]
    if hw.ray_address is None:
        return [*ENTRY_POINT, *overrides]
    env = {"env_vars": {"PYTHONPATH": str(REPO_ROOT)}}
    return ["ray", "job", "submit", "--address", hw.ray_address, "--runtime-env-json", json.dumps(env), "--",
            "python", "-m", "verl.trainer.main_ppo", *overrides]


# ---------------------------------------------------------------------------------------------------------------
# Validation


def compose(overrides: list[str]):
    """verl's packaged `ppo_trainer` config with the overrides applied (Hydra compose API; CPU, ~5 s first time)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="verl.trainer.config", version_base=None):
            return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        text = str(error)
        match = re.search(r"Could not override '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", text)
        if match and ("not in struct" in text or "append to your config" in text or "No match in config" in text):
            raise VerlConfigError(f"unknown verl key {match.group(1)!r}: verl 0.9.1's ppo_trainer config has no such "
                                  "key (check the spelling, or prefix it with + to add a new key)") from error
        raise VerlConfigError(f"verl's Hydra config rejected the overrides: {text.splitlines()[0]}") from error
    finally:
        GlobalHydra.instance().clear()


@functools.lru_cache(maxsize=1)
def _defaults():
    return compose([])


def _default_types(cfg, keys: list[str]) -> list[str]:
    """Values whose type differs from verl's default for the same key (YAML configs carry no schema)."""
    from omegaconf import OmegaConf

    problems = []
    defaults = _defaults()
    for key in keys:
        plain = key.lstrip("+~")
        if plain in UNION_TYPED_KEYS:
            continue
        default = OmegaConf.select(defaults, plain, throw_on_missing=False, default=None)
        value = OmegaConf.select(cfg, plain, throw_on_missing=False, default=None)
        if default is None or value is None:
            continue
        numeric = (int, float)
        if isinstance(default, bool) != isinstance(value, bool):
            problems.append(f"{plain} must be a boolean (True/False), got {value!r}")
        elif isinstance(default, numeric) and not isinstance(value, numeric):
            problems.append(f"{plain} must be a number, got {value!r}")
        elif isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) \
                and not value.is_integer():
            problems.append(f"{plain} must be an integer, got {value!r}")
        elif isinstance(default, str) and not isinstance(value, str):
            problems.append(f"{plain} must be a string, got {value!r}")
    return problems


def resource_problems(config: TrainConfig, hw: Hardware, cfg) -> list[str]:
    """Arithmetic that verl would only discover on the cluster (or not at all)."""
    problems = []
    actor = cfg.actor_rollout_ref.actor
    gpus, tp, sp = hw.gpus, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size, actor.ulysses_sequence_parallel_size
    n = cfg.actor_rollout_ref.rollout.n
    if hw.nnodes < 1 or hw.gpus_per_node < 1:
        problems.append(f"need at least one node and one GPU per node (got {hw.nnodes} x {hw.gpus_per_node})")
        return problems
    if hw.gpus_per_node % tp:
        problems.append(f"rollout tensor parallel size {tp} must divide the GPUs per node ({hw.gpus_per_node}): "
                        "set --tp to a divisor")
    if gpus % sp:
        problems.append(f"Ulysses sequence parallel size {sp} must divide the number of GPUs ({gpus}): set --sp")
    if not problems:
        dp = gpus // sp
        batch, mini = cfg.data.train_batch_size, actor.ppo_mini_batch_size
        if mini > batch:
            problems.append(f"mini-batch ({mini} prompts) is larger than the batch ({batch} prompts): "
                            "lower mini_batch_size")
        if (batch * n) % gpus:
            problems.append(f"batch of {batch} prompts x {n} responses = {batch * n} is not divisible by the "
                            f"{gpus} GPUs (verl splits responses evenly): change train_batch_size or group_size")
        if (mini * n) % dp:
            problems.append(f"mini-batch of {mini} prompts x {n} responses = {mini * n} is not divisible by the "
                            f"data-parallel size {dp} (= {gpus} GPUs / SP {sp}): change mini_batch_size")
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    if actor.use_dynamic_bsz:
        budget = actor.ppo_max_token_len_per_gpu * sp
        if seq > budget:
            problems.append(f"prompt+response = {seq} tokens exceeds the token budget per micro-batch "
                            f"(ppo_max_token_len_per_gpu {actor.ppo_max_token_len_per_gpu} x SP {sp} = {budget}): "
                            "raise actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    if config.dynamic_sampling and cfg.data.gen_batch_size and cfg.data.gen_batch_size < cfg.data.train_batch_size:
        problems.append(f"gen_batch_size ({cfg.data.gen_batch_size}) must be >= train_batch_size "
                        f"({cfg.data.train_batch_size})")
    return problems


def input_problems(config: TrainConfig) -> list[str]:
    problems = []
    model = config.model
    if model not in (None, "embedded"):
        path = Path(model).expanduser()
        looks_local = model.startswith(("/", ".", "~")) or not HUB_ID.match(model)
        if not path.exists() and looks_local:
            problems.append(f"model path {model!r} does not exist (give a local HF directory or a hub id "
                            "like Qwen/Qwen2.5-32B)")
    if not config.train_file:
        problems.append("--train-file is required with --backend verl (verl-format parquet, e.g. DAPO-Math-17k; "
                        "see `python -m data_pipeline`)")
    for name in ("train_file", "val_file"):
        value = getattr(config, name)
        if value and "://" not in value and not Path(value).expanduser().is_file():
            problems.append(f"{name.replace('_', '-')} {value!r} does not exist")
        if value and "://" not in value and not value.endswith(".parquet"):
            problems.append(f"{name.replace('_', '-')} {value!r}: verl reads parquet (convert jsonl first)")
        elif value and Path(value).expanduser().is_file():
            problems += missing_verl_columns(Path(value).expanduser(), f"--{name.replace('_', '-')}")
    if config.rollout_engine == "hf":
        problems.append("rollout_engine 'hf' does not exist in verl 0.9.1's V1 trainer (its rollout registry "
                        "has vllm, sglang, trtllm): use rollout_engine=vllm")
    if config.adv_norm == "batch":
        problems.append("adv_norm 'batch' (Lite PPO's batch-level std) does not exist in verl 0.9.1: use the "
                        "embedded backend, or adv_norm group / none")
    if config.val_max_response_length not in (None, config.max_response_length):
        problems.append("verl validates with data.max_response_length: unset val_max_response_length")
    return problems


VERL_COLUMNS = ("data_source", "prompt", "reward_model")  # what verl's RLHFDataset and reward manager read


def missing_verl_columns(path: Path, flag: str) -> list[str]:
    """The DAPO-Math-17K columns a parquet lacks (read from its schema only: no rows are loaded)."""
    import pyarrow.parquet as pq

    try:
        columns = set(pq.read_schema(path).names)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same message
        return [f"{flag} {str(path)!r} is not a readable parquet file ({error})"]
    missing = [column for column in VERL_COLUMNS if column not in columns]
    if not missing:
        return []
    return [f"{flag} {str(path)!r} lacks the verl columns {missing} (has {sorted(columns)}); build it with "
            "`dapo-suite data build`, which writes the DAPO-Math-17K schema"]


def warnings_for(config: TrainConfig, cfg) -> list[str]:
    notes = []
    if config.dynamic_sampling and cfg.trainer.use_v1 and config.max_num_gen_batches > 0:
        notes.append(f"max_num_gen_batches={config.max_num_gen_batches} is ignored by verl 0.9.1's default V1 "
                     "trainer (trainer.use_v1=True): its replay buffer refills filtered groups until the batch is "
                     "full, with no cap (bound concurrency with algorithm.filter_groups.max_inflight_gen_batches)")
    if HUB_ID.match(str(config.model)) and not Path(config.model).exists():
        notes.append(f"model {config.model!r} is a hub id: every node downloads it (set HF_HOME on shared storage)")
    return notes


def validate(config: TrainConfig, hw: Hardware, overrides: list[str], check_inputs: bool = True):
    """Compose and check; returns (composed config, warnings) or raises VerlConfigError listing every problem."""
    from omegaconf import OmegaConf

    problems = input_problems(config) if check_inputs else []
    cfg = compose(overrides)
    types = _default_types(cfg, [o.split("=", 1)[0] for o in overrides])
    problems += types or resource_problems(config, hw, cfg)
    if not problems:
        problems += _verl_validate(cfg)
    if cfg.reward.reward_manager.name == "dapo" and OmegaConf.select(cfg, "reward_model.overlong_buffer") is not None:
        problems.append("reward_model.overlong_buffer.* is the legacy key verl 0.9 ignores: use "
                        "reward.reward_kwargs.overlong_buffer_cfg.*")
    if problems:
        raise VerlConfigError("verl config is not runnable:\n  - " + "\n  - ".join(problems))
    return cfg, warnings_for(config, cfg)


def _verl_validate(cfg) -> list[str]:
    """verl's own `validate_config` (the one main_ppo runs first), on a copy."""
    import contextlib
    import io

    from omegaconf import OmegaConf
    from verl.utils.config import validate_config

    copy = OmegaConf.create(OmegaConf.to_container(cfg))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            validate_config(copy, use_reference_policy=False, use_critic=False)
    except Exception as error:  # noqa: BLE001 - verl raises assertions, ValueErrors and Hydra instantiation errors
        cause = error.__cause__ or error
        return [f"verl's validate_config: {type(cause).__name__}: {cause}"]
    return []


# ---------------------------------------------------------------------------------------------------------------
# Data, dry run, launch


def write_aime24_parquet(path: Path) -> Path:
    """AIME 2024 (30 problems) in verl's DAPO-Math schema; validation samples val_n per problem (mean@32)."""
    import pandas as pd

    from dapo_suite.prompts import chat_messages

    rows = []
    for index, line in enumerate(AIME24_JSONL.read_text().splitlines()):
        item = json.loads(line)
        rows.append({"data_source": "aime24", "prompt": chat_messages(item["problem"]), "ability": "MATH",
                     "reward_model": {"ground_truth": str(item["answer"]), "style": "rule-lighteval/MATH_v2"},
                     "extra_info": {"index": index, "id": item["id"]}})
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def prepare(config: TrainConfig) -> TrainConfig:
    """Absolute data paths, and the shipped AIME 2024 as validation set when none is given."""
    import dataclasses

    changes: dict[str, Any] = {}
    for name in ("train_file", "val_file"):
        value = getattr(config, name)
        if value and "://" not in value:
            changes[name] = str(Path(value).expanduser().resolve())
    if not config.val_file:
        changes["val_file"] = str(write_aime24_parquet(Path(config.out).resolve() / "data" / "aime24.parquet"))
    return dataclasses.replace(config, **changes)


def dry_run(config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Validate and write RUN_DIR/{config.yaml, verl_config.yaml, verl_command.sh}; start nothing."""
    from omegaconf import OmegaConf

    config = prepare(config)
    overrides = build_overrides(config, hw, passthrough)
    cfg, notes = validate(config, hw, overrides)
    run_dir = Path(config.out)
    argv = command(overrides, hw, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(run_dir / "config.yaml")
    (run_dir / "verl_config.yaml").write_text(OmegaConf.to_yaml(cfg))
    env = f"{MAX_RESPONSE_LENGTH_ENV}={config.max_response_length} PYTHONPATH={shlex.quote(str(REPO_ROOT))}"
    script = f"#!/usr/bin/env bash\n{env} \\\n  " + " \\\n  ".join(shlex.quote(a) for a in argv) + "\n"
    (run_dir / "verl_command.sh").write_text(script)
    return {"argv": argv, "overrides": overrides, "config": cfg, "warnings": notes, "run_dir": run_dir,
            "script": script}


def launch(config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()) -> int:
    """Validate, write the run directory like `dry_run`, then run verl in the foreground; returns its exit code."""
    import subprocess

    plan = dry_run(config, hw, passthrough)
    env = dict(os.environ)
    env[MAX_RESPONSE_LENGTH_ENV] = str(config.max_response_length)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.call(plan["argv"], env=env)


# ---------------------------------------------------------------------------------------------------------------
# Export


def latest_actor_dir(run_dir: Path) -> Path:
    """RUN_DIR/checkpoints/global_step_N/actor of the newest step (verl's layout; also accepts the dir itself)."""
    run_dir = Path(run_dir)
    if (run_dir / "fsdp_config.json").is_file():
        return run_dir
    root = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    marker = root / "latest_checkpointed_iteration.txt"
    if marker.is_file():
        step_dir = root / f"global_step_{marker.read_text().strip()}"
    else:
        steps = sorted(root.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
        if not steps:
            raise FileNotFoundError(f"no verl checkpoint under {root} (expected global_step_N/actor)")
        step_dir = steps[-1]
    actor = step_dir / "actor"
    if not (actor / "fsdp_config.json").is_file():
        raise FileNotFoundError(f"{actor} is not an FSDP actor checkpoint (no fsdp_config.json)")
    return actor


def export_command(actor_dir: Path, target_dir: Path) -> list[str]:
    return [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor_dir),
            "--target_dir", str(target_dir)]
