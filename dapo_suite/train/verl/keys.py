"""TrainConfig -> the Hydra override list of verl 0.9.1's `python -m verl.trainer.main_ppo`.

One table (`VERL_KEYS`) maps every TrainConfig field that verl has a knob for onto verl 0.9.1's Hydra key(s)
and a converter; the embedded trainer reads the same fields, so a preset (`grpo` ... `dapo`) means the same on
both. Then come the paper's constants (`PAPER_CONSTANTS`: GRPO advantage, no KL, reward manager `dapo`, our
`compute_score`), the hardware keys (`hardware_overrides`), and raw `verl.<key>=value` passthroughs last.

verl 0.9.1 traps handled here (see docs/train-at-scale.md):
- the soft overlong penalty lives in `reward.reward_kwargs.overlong_buffer_cfg` (+ `max_resp_len`), keys
  verl's schema does not declare (hence the `+` prefix); the recipe's `reward_model.overlong_buffer.*` are
  ignored;
- `algorithm.filter_groups.metric` defaults to `reward` (includes the overlong penalty): the paper filters on
  acc;
- overlong filtering does not exist in verl: `dapo_suite.train.verl.extensions` registers it as a policy loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dapo_suite.inference.hub import registered_id
from dapo_suite.train.config import TrainConfig

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # dapo_suite/
REPO_ROOT = PACKAGE_DIR.parent
# verl loads the reward by module ("pkg://"), so a node without the driver's checkout finds it where Ray's
# runtime_env (py_modules) put the package; a file path would name the driver's disk.
REWARD_MODULE = "pkg://dapo_suite.core.reward"
EXTENSION_MODULE = "dapo_suite.train.verl.extensions"
OVERLONG_FILTER_LOSS = "dapo_overlong_filter"  # extensions registers it (that module imports verl)
ROLLOUT_CORRECTION = "algorithm.rollout_correction"
MAX_RESPONSE_LENGTH_ENV = "DAPO_SUITE_MAX_RESPONSE_LENGTH"
ACTOR = "actor_rollout_ref.actor"
MODEL = "actor_rollout_ref.model"
ROLLOUT = "actor_rollout_ref.rollout"
REWARD_KWARGS = "+reward.reward_kwargs"
OVERLONG = f"{REWARD_KWARGS}.overlong_buffer_cfg"
# environment variables Ray gives every worker of the job
WORKER_ENV = "+ray_kwargs.ray_init.runtime_env.env_vars"


class VerlConfigError(ValueError):
    """The override list would not run: the message says what to change."""


def _same(value: Any, config: TrainConfig) -> Any:
    return value


def overlong_filter_loss_name(loss_mode: str) -> str:
    """The name `extensions` registers for `loss_mode` restricted to non-truncated responses."""
    return OVERLONG_FILTER_LOSS if loss_mode == "vanilla" else f"{OVERLONG_FILTER_LOSS}_{loss_mode}"


def _corrects(config: TrainConfig) -> bool:
    return config.rollout_correction != "off"


def _number(threshold: str | None) -> float | str | None:
    """A threshold as verl reads it: a number when it is one, else the "lower_upper" string."""
    try:
        return None if threshold is None else float(threshold)
    except ValueError:
        return threshold


def model_path(model: str) -> str:
    """The model as verl loads it: the embedded model's folder, a local path made absolute, or a hub id."""
    if model in (None, "embedded"):
        from dapo_suite.inference.models import embedded_model_path

        return str(embedded_model_path())
    if Path(model).expanduser().exists():
        return str(Path(model).expanduser().resolve())
    return registered_id(model) or model  # a short name (Qwen2.5-32B) as its hub id


# verl 0.9.1's agent loops by name: multi-turn runs verl's tool loop with the model's own tokens kept apart
# (tool_trajectories, registered by AGENT_LOOP_CONFIG), one turn verl's single-turn loop
AGENT_LOOPS = {True: "dapo_tool_agent", False: "single_turn_agent"}
AGENT_LOOP_CONFIG = PACKAGE_DIR / "train" / "verl" / "agent_loops.yaml"
# verl's DAPO reward manager, by name; on a tool run the same over the model's own tokens, by module
REWARD_MANAGERS = {
    False: {"source": "register", "name": "dapo"},
    True: {
        "source": "importlib",
        "name": "ModelTokenRewardManager",
        "module.path": "pkg://dapo_suite.train.verl.tool_trajectories",
    },
}
# the sandbox as verl's tool (dapo_suite.train.verl.sandbox_tool.SandboxTool), the default tool config
PYTHON_TOOL_CONFIG = PACKAGE_DIR / "core" / "sandbox" / "python_tool.yaml"


def tool_config(path: str | None, config: TrainConfig) -> str | None:
    """The tool config verl's agent loop reads: the user's YAML, else the shipped sandbox tool; None (no
    tools) for a single-turn run."""
    if not config.multi_turn:
        return None
    return str(Path(path).resolve()) if path else str(PYTHON_TOOL_CONFIG)


@dataclass(frozen=True)
class VerlKey:
    """One row of the table: a TrainConfig field, the verl key(s) it sets, and how its value converts."""

    field: str
    keys: tuple[str, ...]
    convert: Callable[[Any, TrainConfig], Any] = _same


# TrainConfig field -> verl 0.9.1 Hydra key(s). A leading "+" adds a key verl's schema does not declare.
VERL_KEYS: tuple[VerlKey, ...] = (
    VerlKey("model", ("actor_rollout_ref.model.path",), lambda v, c: model_path(v)),
    VerlKey("train_file", ("data.train_files",)),
    VerlKey("val_file", ("data.val_files",)),
    VerlKey("seed", ("data.seed",)),
    # rollout
    VerlKey("train_batch_size", ("data.train_batch_size",)),
    # Without dynamic sampling a generation batch is the training batch.
    VerlKey(
        "gen_batch_size",
        ("data.gen_batch_size",),
        lambda v, c: v if c.dynamic_sampling else c.train_batch_size,
    ),
    VerlKey("group_size", (f"{ROLLOUT}.n",)),
    VerlKey("max_prompt_length", ("data.max_prompt_length",)),
    VerlKey("max_response_length", ("data.max_response_length", "+reward.reward_kwargs.max_resp_len")),
    # L_max for the overlong-filter loss, set here and nowhere else: Ray gives these env vars to every worker
    # of the job, local or submitted. It is not a config field because verl 0.9.1 passes a registered loss
    # only the actor config (`ActorConfig`), which holds no response length and rejects undeclared keys; its
    # one free-form dict, `global_batch_info`, is spread into `agg_loss` as keywords. Ray wants env values as
    # strings.
    VerlKey("max_response_length", (f"{WORKER_ENV}.{MAX_RESPONSE_LENGTH_ENV}",), lambda v, c: str(v)),
    VerlKey("temperature", (f"{ROLLOUT}.temperature",)),
    VerlKey("top_p", (f"{ROLLOUT}.top_p",)),
    VerlKey("rollout_engine", (f"{ROLLOUT}.name",), lambda v, c: "vllm" if v == "auto" else v),
    # the DAPO switches
    VerlKey("dynamic_sampling", ("algorithm.filter_groups.enable",)),
    # "reward" (correctness + overlong penalty) and "acc" (compute_score's acc) are verl's own metric names
    VerlKey("filter_metric", ("algorithm.filter_groups.metric",)),
    VerlKey("max_num_gen_batches", ("algorithm.filter_groups.max_num_gen_batches",)),
    VerlKey("clip_low", (f"{ACTOR}.clip_ratio_low",)),
    VerlKey("clip_high", (f"{ACTOR}.clip_ratio_high",)),
    # verl always applies dual-clip; "off" is a bound no ratio reaches
    VerlKey("clip_c", (f"{ACTOR}.clip_ratio_c",), lambda v, c: 1e9 if v is None else v),
    VerlKey("loss_agg", (f"{ACTOR}.loss_agg_mode",)),
    VerlKey("overlong_penalty", (f"{OVERLONG}.enable",)),
    VerlKey("overlong_buffer_len", (f"{OVERLONG}.len",)),
    VerlKey("overlong_penalty_factor", (f"{OVERLONG}.penalty_factor",)),
    # ReTool's shaping, read by tool_trajectories.ModelTokenRewardManager
    VerlKey("tool_call_bonus", (f"{REWARD_KWARGS}.tool_call_bonus",)),
    VerlKey("tool_call_bonus_cap", (f"{REWARD_KWARGS}.tool_call_bonus_cap",)),
    # the objective; with overlong filtering, the `extensions` wrapper of the same loss
    VerlKey(
        "loss_mode",
        (f"{ACTOR}.policy_loss.loss_mode",),
        lambda v, c: overlong_filter_loss_name(v) if c.overlong_filter else v,
    ),
    *(
        VerlKey(name, (f"{ACTOR}.policy_loss.{name}",))
        for name in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")
    ),
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
    # LoRA: PEFT on the FSDP actor (verl's ModelConfig types lora_alpha as int, so a whole alpha goes as one)
    VerlKey("lora_rank", (f"{MODEL}.lora_rank",)),
    VerlKey("lora_alpha", (f"{MODEL}.lora_alpha",), lambda v, c: int(v) if float(v).is_integer() else v),
    VerlKey("lora_targets", (f"{MODEL}.target_modules",), lambda v, c: c.lora_target_list),
    # budget, validation, checkpoints
    # multi-turn with tools: verl's agent loop runs its tool_agent loop (Hermes calls) over the tool config;
    # without these verl trains single-turn silently (verl #2966, #2986), which validate refuses
    VerlKey("multi_turn", (f"{ROLLOUT}.multi_turn.enable",)),
    VerlKey("multi_turn", (f"{ROLLOUT}.agent.default_agent_loop",), lambda v, c: AGENT_LOOPS[bool(v)]),
    VerlKey(
        "multi_turn",
        (f"{ROLLOUT}.agent.agent_loop_config_path",),
        lambda v, c: str(AGENT_LOOP_CONFIG) if v else None,
    ),
    # the grade and the overlong penalty over the model's own tokens, as on the embedded path
    *(
        VerlKey(
            "multi_turn",
            (f"reward.reward_manager.{key}",),
            lambda v, c, key=key: REWARD_MANAGERS[bool(v)][key],
        )
        for key in ("source", "name")
    ),
    VerlKey(
        "multi_turn",
        ("reward.reward_manager.module.path",),
        lambda v, c: REWARD_MANAGERS[True]["module.path"] if v else None,
    ),
    # what the agent loop needs besides, verl 0.9.1's defaults, pinned
    VerlKey("multi_turn", (f"{ROLLOUT}.mode",), lambda v, c: "async"),
    VerlKey("multi_turn", ("data.return_raw_chat",), lambda v, c: True),
    VerlKey("max_assistant_turns", (f"{ROLLOUT}.multi_turn.max_assistant_turns",)),
    VerlKey("max_tool_response_length", (f"{ROLLOUT}.multi_turn.max_tool_response_length",)),
    VerlKey("tool_response_truncate_side", (f"{ROLLOUT}.multi_turn.tool_response_truncate_side",)),
    VerlKey("tool_format", (f"{ROLLOUT}.multi_turn.format",)),  # python_block: tool_trajectories' parser
    VerlKey("tool_config_path", (f"{ROLLOUT}.multi_turn.tool_config_path",), lambda v, c: tool_config(v, c)),
    VerlKey("max_steps", ("trainer.total_training_steps",)),
    VerlKey("eval_every", ("trainer.test_freq",), lambda v, c: v if v > 0 and c.heldout_eval else -1),
    VerlKey("heldout_eval", ("trainer.val_before_train",)),
    VerlKey("val_n", (f"{ROLLOUT}.val_kwargs.n",)),
    VerlKey("val_temperature", (f"{ROLLOUT}.val_kwargs.temperature",)),
    VerlKey("val_top_p", (f"{ROLLOUT}.val_kwargs.top_p",)),
    VerlKey("save_every", ("trainer.save_freq",)),
    VerlKey("keep_checkpoints", ("trainer.max_actor_ckpt_to_keep",)),
    VerlKey("wandb_project", ("trainer.project_name",), lambda v, c: v or "dapo-suite"),
)

# Fields verl has no knob for (or that only the embedded trainer uses), with the reason; a test checks that
# every TrainConfig field is either in VERL_KEYS or here.
NOT_MAPPED = {
    "task": "without --train-file, data.prepare writes the task's train and held-out splits as parquet",
    "heldout_size": "embedded trainer only",
    "prompt_shots": "verl reads prompts from the parquet: data.prepare writes the built-in task with the "
    "shots; a --train-file keeps the prompts it holds",
    "rollout_gpu_memory_utilization": "embedded trainer only; verl: --gpu-memory-utilization (Hardware)",
    "sampling_dtype": "embedded trainer only; verl samples with vLLM in actor_rollout_ref.rollout.dtype",
    "rollout_quantization": "embedded trainer's sampler only (validation refuses it with --backend verl)",
    "rollout_kv_cache_dtype": "embedded trainer's sampler only (validation refuses bfloat16 with --backend "
    "verl; vLLM takes its own kv_cache_dtype engine argument)",
    "backend": "selects this module",
    "reuse_surplus_groups": "verl's V1 replay buffer decides (surplus groups are discarded, counted in "
    "metrics)",
    "micro_batch_size": "verl packs micro-batches by tokens (use_dynamic_bsz); see hardware_overrides",
    "gradient_checkpointing": (
        "verl: always on (actor_rollout_ref.model.enable_gradient_checkpointing, below)"
    ),
    "val_max_response_length": "verl validates with data.max_response_length; must be unset or equal",
    "dtype": "verl trains in bf16 mixed precision with fp32 master weights (fsdp_config.dtype)",
    "autocast_dtype": "--device cpu: fsdp_config.mixed_precision.param_dtype (cpu_overrides); on GPUs verl's "
    "bf16 mixed precision, as in the paper's run",
    "device": "verl uses the GPUs Ray gives it",
    "presets": "record only",
    "out": "run_dir_overrides: trainer.default_local_dir=OUT/checkpoints, trainer.experiment_name=basename",
    "overlong_filter": "selects the overlong-filter wrapper of loss_mode (see the loss_mode row)",
    "rollout_correction": "on or off through rollout_is / rollout_rs (null = off); auto is on (vLLM vs FSDP)",
    "async_mode": "selects the trainer: ASYNC_TRAINERS (verl/experimental/<package>, its config and keys)",
    "staleness_threshold": "async=fully: async_training.staleness_threshold (fully_async_keys)",
    "partial_rollout": "async=fully: async_training.partial_rollout (fully_async_keys)",
    "tool_isolation": "verl: the tool config YAML's config.isolation (the shipped python_tool.yaml: bwrap)",
}

# The paper's run, fixed whatever the preset (reference doc section 2).
PAPER_CONSTANTS: tuple[tuple[str, Any], ...] = (
    ("algorithm.use_kl_in_reward", False),
    ("algorithm.kl_ctrl.kl_coef", 0.0),
    (f"{ACTOR}.use_kl_loss", False),
    (f"{ACTOR}.kl_loss_coef", 0.0),
    (f"{ACTOR}.entropy_coeff", 0),
    # Warm-up that never trains a step at lr 0: verl's "constant" schedule gives step 1 the factor 0/w (a
    # first step that learns nothing); its "cosine" schedule with no cycle is constant after the warm-up, and
    # with one-indexed steps gives step k the factor k/w, as the embedded trainer's warm-up reaches lr at step
    # w.
    (f"{ACTOR}.optim.lr_scheduler_type", "cosine"),
    (f"{ACTOR}.optim.num_cycles", 0.0),
    (f"{ACTOR}.optim.zero_indexed_step", False),
    (f"{ROLLOUT}.val_kwargs.do_sample", True),
    (f"{ROLLOUT}.val_kwargs.top_k", -1),
    (f"{ROLLOUT}.top_k", -1),
    ("reward.custom_reward_function.path", REWARD_MODULE),
    ("reward.custom_reward_function.name", "compute_score"),
    (f"{OVERLONG}.log", False),
    ("actor_rollout_ref.model.external_lib", EXTENSION_MODULE),
    ("actor_rollout_ref.model.use_remove_padding", True),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
    ("data.prompt_key", "prompt"),
    ("data.truncation", "left"),
    ("data.filter_overlong_prompts", True),
    ("trainer.resume_mode", "auto"),
    ("trainer.logger", ["console", "tensorboard", "file"]),
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
    device: str = "cuda"  # "cpu": verl's trainer on this machine's CPU (cpu_overrides, cpu_environment)
    rollout_gpus: int | None = None  # async: GPUs that generate (the rest train); None = half (split_gpus)

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
    """GPUs, parallelism, offload and token budgets (the recipe's: dynamic batch of prompt+response
    tokens)."""
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


def filter_budget(config: TrainConfig) -> int:
    """Groups dynamic sampling may drop in one step before the run stops (0 = no bound), as in DAPO's
    recipe."""
    return config.max_num_gen_batches * config.gen_batch_size


def stop_file(config: TrainConfig) -> str:
    return str(Path(config.out).resolve() / STOP_FILE)


REPLAY_BUFFER = "pkg://dapo_suite.train.verl.replay"
STOP_FILE = "stopped.json"  # RUN_DIR/stopped.json: why the run stopped early (launch reads it)
SAMPLER = "trainer.v1.sampler"


def replay_overrides(config: TrainConfig) -> list[tuple[str, Any]]:
    """Dynamic sampling with the user's bound: verl's V1 replay buffer refills filtered groups without one, so
    the project's subclass (`replay.CappedDAPOReplayBuffer`) stops the run past max_num_gen_batches x
    gen_batch_size filtered groups in a step. 0 keeps verl's own buffer (no limit)."""
    if not config.dynamic_sampling or config.max_num_gen_batches <= 0:
        return []
    options = {
        "metric": config.filter_metric,
        "train_batch_size": config.train_batch_size,
        "max_filtered_groups": filter_budget(config),
        "stop_file": stop_file(config),
    }
    return [
        (f"{SAMPLER}.custom_sampler.path", REPLAY_BUFFER),
        (f"{SAMPLER}.custom_sampler.name", "CappedDAPOReplayBuffer"),
        *((f"+{SAMPLER}.sampler_kwargs.{name}", value) for name, value in options.items()),
    ]


# verl 0.9.1's async trainers (docs/train-at-scale.md, "Async"): generation and training on separate GPUs,
# started through `ASYNC_ENTRY`, which puts DAPO's group filter where their rollouts are produced.
ASYNC_ENTRY = "dapo_suite.train.verl.async_entry"
# Read by ASYNC_ENTRY (verl ignores top-level keys it does not know): the filter's bound and where a stop is
# written
ASYNC_FILTER = "+dapo_suite.dynamic_sampling"
# verl's one-step config names its base config by a path relative to verl's source tree; this finds it
# anywhere
BASE_CONFIG_SEARCHPATH = ("hydra.searchpath", ["pkg://verl.trainer.config"])


@dataclass(frozen=True)
class AsyncTrainer:
    """One of verl's async trainers: its package (verl/experimental/<package>), packaged config, and keys."""

    package: str
    config_name: str
    keys: Callable[[TrainConfig], list[tuple[str, Any]]]
    verl_validates: bool  # its entry point runs verl's validate_config first (the fully async one does not)


def one_step_keys(config: TrainConfig) -> list[tuple[str, Any]]:
    """The table's batch keys hold: the dataloader yields gen_batch_size prompts and a step trains on
    train_batch_size mixed groups, generated while the step before trains."""
    return []


def fully_async_keys(config: TrainConfig) -> list[tuple[str, Any]]:
    """The rollouter streams one prompt's group at a time; the trainer updates on a mini-batch of groups and
    syncs the weights once per dapo-suite step (train_batch_size prompts), so a step means the same as in sync
    mode."""
    return [
        ("data.train_batch_size", 0),
        ("data.gen_batch_size", 1),
        ("rollout.n", config.group_size),
        ("rollout.total_rollout_steps", config.max_steps * config.train_batch_size),
        ("async_training.require_batches", 1),
        ("async_training.trigger_parameter_sync_step", config.train_batch_size // config.mini_batch_size),
        ("async_training.staleness_threshold", config.staleness_threshold),
        ("async_training.partial_rollout", config.partial_rollout),
    ]


ASYNC_TRAINERS: dict[str, AsyncTrainer] = {
    "one_step": AsyncTrainer(
        "one_step_off_policy", "one_step_off_ppo_trainer", one_step_keys, verl_validates=True
    ),
    "fully": AsyncTrainer(
        "fully_async_policy", "fully_async_ppo_trainer", fully_async_keys, verl_validates=False
    ),
}


def split_gpus(hw: Hardware) -> tuple[Hardware, Hardware]:
    """(training side, generation side) of an async run: whole nodes each, or the GPUs of a single node
    split."""
    total, per_node = hw.gpus, hw.gpus_per_node
    rollout = hw.rollout_gpus if hw.rollout_gpus is not None else total // 2
    if not 0 < rollout < total:
        more = " (on a CPU: --gpus-per-node 2 gives each side one logical GPU)" if total < 2 else ""
        raise VerlConfigError(
            f"--rollout-gpus {rollout}: an async run needs GPUs on both sides, 1 to {total - 1} "
            f"of the {total} ({hw.nnodes} x {per_node}){more}"
        )
    if rollout % per_node == 0:
        nodes = rollout // per_node
        return replace(hw, nnodes=hw.nnodes - nodes), replace(hw, nnodes=nodes)
    if hw.nnodes == 1:
        return replace(hw, gpus_per_node=per_node - rollout), replace(hw, gpus_per_node=rollout)
    raise VerlConfigError(
        f"--rollout-gpus {rollout}: on {hw.nnodes} nodes verl splits by whole nodes, so give a "
        f"multiple of {per_node} (the GPUs per node) below {total}, e.g. {total // 2}"
    )


def training_side(config: TrainConfig, hw: Hardware) -> Hardware:
    """The GPUs that train: all of them, or an async run's training side."""
    return split_gpus(hw)[0] if config.async_mode in ASYNC_TRAINERS else hw


def async_overrides(config: TrainConfig, hw: Hardware) -> list[tuple[str, Any]]:
    """The keys of an async run: the resource split, the trainer's own keys, and the group filter's bound."""
    if config.async_mode not in ASYNC_TRAINERS:
        return []
    train, rollout = split_gpus(hw)
    filter_keys = (
        [
            (f"{ASYNC_FILTER}.max_filtered_groups", filter_budget(config)),
            (f"{ASYNC_FILTER}.stop_file", stop_file(config)),
        ]
        if config.dynamic_sampling
        else []
    )
    return [
        BASE_CONFIG_SEARCHPATH,
        # generation keeps its own GPUs: the trainer's workers hold no vLLM engine
        ("actor_rollout_ref.hybrid_engine", False),
        ("trainer.nnodes", train.nnodes),
        ("trainer.n_gpus_per_node", train.gpus_per_node),
        ("rollout.nnodes", rollout.nnodes),
        ("rollout.n_gpus_per_node", rollout.gpus_per_node),
        (f"{ROLLOUT}.tensor_model_parallel_size", rollout.tp),
        # verl's async configs set bypass mode, which swaps the policy loss for its own (no overlong filter,
        # no successor's objective); decoupled mode keeps the loss and weights stale samples by pi_old /
        # pi_rollout
        (f"{ROLLOUT_CORRECTION}.bypass_mode", False),
        *ASYNC_TRAINERS[config.async_mode].keys(config),
        *filter_keys,
    ]


# verl's "file" logger: {"step": N, "data": {metric: value}} per step
VERL_METRICS_FILE = "verl_metrics.jsonl"


def run_dir_overrides(config: TrainConfig) -> list[tuple[str, Any]]:
    """Everything a run writes goes under RUN_DIR: checkpoints, validation generations, and verl's metric
    loggers (which default to folders of the current directory; they read their paths from the
    environment)."""
    run_dir = Path(config.out).resolve()
    return [
        ("trainer.default_local_dir", str(run_dir / "checkpoints")),
        ("trainer.experiment_name", run_dir.name),
        ("trainer.rollout_data_dir", None),
        ("trainer.validation_data_dir", str(run_dir / "validation")),
        (f"{WORKER_ENV}.TENSORBOARD_DIR", str(run_dir / "tensorboard")),
        (f"{WORKER_ENV}.VERL_FILE_LOGGER_PATH", str(run_dir / VERL_METRICS_FILE)),
    ]
