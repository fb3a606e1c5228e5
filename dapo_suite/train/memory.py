"""The memory a training run needs, estimated from the model's config before the model loads, and the run that
fits when it does not.

`estimate` adds up what the embedded trainer holds at its peak: the weights in the dtype they load in; for
what trains (every parameter, or LoRA's adapters in float32) a gradient and AdamW's two moments; the sampler's
snapshot of the weights; and the larger of one micro-batch's activations kept for the backward pass (with its
logits over the vocabulary) and one rollout batch's KV cache. Parameters come from config.json's shape
(`parameter_count`), so a model is sized before a byte of it is downloaded (`hub.model_shape`). `check` sets
it against this machine's memory and, when it cannot fit, finds what does: a smaller micro-batch or gradient
checkpointing, LoRA, or verl on the GPUs its arithmetic needs (`verl.gpus.gpus_needed`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dapo_suite.inference.models import resolve_precision, weights_dtype
from dapo_suite.train.config import TrainConfig
from dapo_suite.train.rollout import ROLLOUT_BATCH_ROWS
from dapo_suite.train.verl.gpus import GPUS_PER_NODE, GpuPlan, gpus_needed

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAPTER_BYTES = 4  # LoRA's adapters, their gradients and AdamW state stay float32
RUNTIME_BYTES = 2**30  # the interpreter, torch and transformers
# Floats kept per token and block for the backward pass: about 6 vectors of the hidden size (norms,
# attention's inputs and output, residuals) and 4 of the MLP's width (gate, up, their product, its activation)
SAVED_HIDDEN, SAVED_MLP = 6, 4
LOGIT_COPIES = 3  # float32 logits over the vocabulary, their log-softmax and its gradient
QKV_BIAS = {"qwen2"}  # model types whose q, k and v projections carry a bias whatever attention_bias says
QK_NORM = {"qwen3", "qwen3_moe"}  # model types with an RMSNorm over each head's queries and keys
LORA_TRIAL = {"lora_rank": 16, "lora_alpha": 32}  # the adapters a refused full fine-tuning is offered


def _head_dim(shape: dict) -> int:
    return shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]


def _mlp_width(shape: dict, active: bool = False) -> int:
    """The MLP's width per expert (a dense model: its one MLP); `active`: summed over the experts a token
    uses."""
    if not shape.get("num_experts"):
        return shape["intermediate_size"]
    return shape["moe_intermediate_size"] * (shape["num_experts_per_tok"] if active else 1)


def linear_shapes(shape: dict) -> dict[str, tuple[int, int, int]]:
    """The linear layers of one decoder block, as PEFT names them: name -> (inputs, outputs, copies per
    block)."""
    hidden, heads, kv_heads = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim, width, experts = _head_dim(shape), _mlp_width(shape), shape.get("num_experts") or 1
    layers = {
        "q_proj": (hidden, heads * head_dim, 1),
        "k_proj": (hidden, kv_heads * head_dim, 1),
        "v_proj": (hidden, kv_heads * head_dim, 1),
        "o_proj": (heads * head_dim, hidden, 1),
        "gate_proj": (hidden, width, experts),
        "up_proj": (hidden, width, experts),
        "down_proj": (width, hidden, experts),
    }
    if experts > 1:
        layers["gate"] = (hidden, experts, 1)  # the router
    return layers


def parameter_count(shape: dict) -> int:
    """Parameters of a Llama / Qwen2 / Qwen3 (dense or mixture-of-experts) decoder from its config.json
    fields: the embeddings (the output head too unless tied), each block's linear layers, biases and norms,
    the final norm."""
    hidden, vocab, blocks = shape["hidden_size"], shape["vocab_size"], shape["num_hidden_layers"]
    linears = linear_shapes(shape)
    block = sum(inputs * outputs * copies for inputs, outputs, copies in linears.values()) + 2 * hidden
    model_type, biased = shape.get("model_type"), shape.get("attention_bias", False)
    if model_type in QKV_BIAS or biased:
        block += sum(linears[name][1] for name in ("q_proj", "k_proj", "v_proj"))
    if biased:
        block += hidden  # o_proj's
    if shape.get("mlp_bias"):
        block += sum(
            outputs * copies
            for name, (_, outputs, copies) in linears.items()
            if name in ("gate_proj", "up_proj", "down_proj")
        )
    if model_type in QK_NORM:
        block += 2 * _head_dim(shape)
    head = 0 if shape.get("tie_word_embeddings", False) else vocab * hidden
    return vocab * hidden + head + blocks * block + hidden


def adapter_parameter_count(shape: dict, rank: int, targets: str | list[str]) -> int:
    """LoRA's parameters: rank x (inputs + outputs) for each targeted linear layer of every block
    ("all-linear": all of them, as PEFT, the output head excepted)."""
    chosen = (
        linear_shapes(shape)
        if targets == "all-linear"
        else {name: dims for name, dims in linear_shapes(shape).items() if name in targets}
    )
    return shape["num_hidden_layers"] * sum(
        rank * (inputs + outputs) * copies for inputs, outputs, copies in chosen.values()
    )


def _gib(value: float) -> str:
    return f"{value / 2**30:,.1f}"


@dataclass(frozen=True)
class MemoryEstimate:
    """What the embedded trainer holds, in bytes, part by part (see the module docstring)."""

    parameters: int
    trained: int  # parameters that get a gradient and AdamW state: all of them, or LoRA's adapters
    lora: bool
    weights: int
    gradients: int
    optimizer: int
    activations: int  # one micro-batch's kept activations and logits
    snapshot: int  # the sampler's copy of the weights
    kv_cache: int  # one rollout batch's keys and values
    tokens: int  # of the micro-batch `activations` is for

    @property
    def update(self) -> int:
        """The peak of a policy update alone (what benchmarks/real_shapes.py measures: no sampler)."""
        return self.weights + self.gradients + self.optimizer + self.activations + RUNTIME_BYTES

    @property
    def peak(self) -> int:
        """The peak of a training run: the sampler's snapshot stays beside the update, its KV cache comes and
        goes."""
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.snapshot
            + RUNTIME_BYTES
            + max(self.activations, self.kv_cache)
        )

    def summary(self) -> str:
        mode = f"LoRA ({self.trained / 1e6:,.1f} M adapter parameters)" if self.lora else "full fine-tuning"
        return (
            f"{mode} of {self.parameters / 1e9:,.2f} B parameters needs about {_gib(self.peak)} GiB: weights "
            f"{_gib(self.weights)}, gradients {_gib(self.gradients)}, AdamW state {_gib(self.optimizer)}, "
            f"the sampler's copy of the weights {_gib(self.snapshot)}, runtime {_gib(RUNTIME_BYTES)}, and "
            f"the larger of a micro-batch's activations ({self.tokens:,} tokens: {_gib(self.activations)}) "
            f"and a rollout batch's KV cache ({_gib(self.kv_cache)})"
        )


def _prompt_passes(config: TrainConfig) -> int:
    """The most prompts one micro-batch runs: the trainer runs a group's prompt once for its responses in a
    micro-batch (not under gradient checkpointing), and a mini-batch is whole groups of group_size
    responses."""
    group, micro = config.group_size, config.micro_batch_size
    total = config.mini_batch_size * group
    return max(
        (min(start + micro, total) - 1) // group - start // group + 1 for start in range(0, total, micro)
    )


def estimate(config: TrainConfig, shape: dict, device: str = "cpu") -> MemoryEstimate:
    """The embedded trainer's memory for `config` on a model of config.json fields `shape`, in the dtypes
    `config` resolves to on `device` (cpu or cuda); lengths at their limits (max_prompt_length +
    max_response_length)."""
    lora = config.lora_rank > 0
    dtype = weights_dtype(config.dtype, lora, device)
    sampling = resolve_precision(config.sampling_dtype, device) or dtype
    parameters = parameter_count(shape)
    adapters = adapter_parameter_count(shape, config.lora_rank, config.lora_target_list) if lora else 0
    trained, trained_bytes = (adapters, ADAPTER_BYTES) if lora else (parameters, DTYPE_BYTES[dtype])
    hidden, blocks = shape["hidden_size"], shape["num_hidden_layers"]
    prompts = config.micro_batch_size if config.gradient_checkpointing else _prompt_passes(config)
    tokens = prompts * config.max_prompt_length + config.micro_batch_size * config.max_response_length
    per_block = (SAVED_HIDDEN * hidden + SAVED_MLP * _mlp_width(shape, active=True)) * 4
    # checkpointing keeps each block's input and recomputes one block at a time
    kept = (
        tokens * (blocks * hidden * 4 + per_block)
        if config.gradient_checkpointing
        else tokens * blocks * per_block
    )
    logits = (
        config.micro_batch_size * (config.max_response_length + 1) * shape["vocab_size"] * 4 * LOGIT_COPIES
    )
    rows = min(ROLLOUT_BATCH_ROWS, config.gen_batch_size * config.group_size)
    cached = config.max_prompt_length + max(config.max_response_length, config.eval_max_tokens)
    kv_cache = (
        rows * cached * blocks * 2 * shape["num_key_value_heads"] * _head_dim(shape) * DTYPE_BYTES[sampling]
    )
    return MemoryEstimate(
        parameters=parameters,
        trained=trained,
        lora=lora,
        weights=parameters * DTYPE_BYTES[dtype] + adapters * ADAPTER_BYTES,
        gradients=trained * trained_bytes,
        optimizer=2 * trained * trained_bytes,
        activations=kept + logits,
        snapshot=parameters * DTYPE_BYTES[sampling],
        kv_cache=kv_cache,
        tokens=tokens,
    )


SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


MOE_FIELDS = ("moe_intermediate_size", "num_experts_per_tok")


def sizable(shape: dict) -> bool:
    """Whether `parameter_count` reads this config.json: a decoder with Llama's fields (and, with experts,
    Qwen3-MoE's)."""
    needed = SHAPE_FIELDS + (MOE_FIELDS if shape.get("num_experts") else ())
    return all(isinstance(shape.get(name), int) for name in needed)


def device_type(device: str) -> str:
    """A TrainConfig device as the trainer resolves it: "auto" is cuda where a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_memory(device: str) -> tuple[int, int]:
    """(available, total) bytes where the trainer runs: a GPU's (torch.cuda.mem_get_info), else this machine's
    (/proc/meminfo's MemAvailable and MemTotal)."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = int(value.split()[0]) * 1024
    return fields["MemAvailable"], fields["MemTotal"]


def verl_plan(config: TrainConfig, shape: dict, gpus_per_node: int = GPUS_PER_NODE) -> GpuPlan | None:
    """The GPUs verl needs for `config` on a model of config.json fields `shape` (`verl.gpus.gpus_needed`)."""
    parameters = parameter_count(shape)
    if not config.lora_rank:
        return gpus_needed(config, 0, parameters, gpus_per_node)
    return gpus_needed(
        config,
        parameters,
        adapter_parameter_count(shape, config.lora_rank, config.lora_target_list),
        gpus_per_node,
    )


def _trials(config: TrainConfig) -> list[dict[str, Any]]:
    """The changes `check` offers, least first: smaller micro-batches (memory, not maths), then gradient
    checkpointing too; then, for a full fine-tuning run, the same with LoRA's adapters."""
    trials = []
    for lora in ({}, LORA_TRIAL) if not config.lora_rank else ({},):
        for checkpointing in sorted({config.gradient_checkpointing, True}):
            micro = config.micro_batch_size
            while micro >= 1:
                changes = {**lora, "micro_batch_size": micro, "gradient_checkpointing": checkpointing}
                trials.append({key: value for key, value in changes.items() if getattr(config, key) != value})
                micro //= 2
    return [changes for changes in trials if changes]


@dataclass(frozen=True)
class MemoryCheck:
    """The estimate against this machine's memory, and when it cannot fit, what does."""

    estimate: MemoryEstimate
    available: int
    total: int
    fitting: dict[str, Any] | None = None  # --set changes whose estimate fits in the memory available now
    verl: GpuPlan | None = None  # the verl layout, when nothing fits here

    @property
    def fits(self) -> bool:
        """The estimate is within this machine's memory (what other programs hold now aside)."""
        return self.estimate.peak <= self.total

    def summary(self) -> str:
        return (
            f"memory: {self.estimate.summary()}; this machine has {_gib(self.available)} GiB available of "
            f"{_gib(self.total)} GiB"
        )


def check(
    config: TrainConfig, shape: dict, device: str = "cpu", memory: tuple[int, int] | None = None
) -> MemoryCheck:
    """`estimate` against `memory` (available, total; default: `device_memory(device)`); when it exceeds the
    total, the first of `_trials` that fits in what is available, else the GPUs verl would need."""
    available, total = memory or device_memory(device)
    found = estimate(config, shape, device)
    if found.peak <= total:
        return MemoryCheck(found, available, total)
    for changes in _trials(config):
        if estimate(replace(config, **changes), shape, device).peak <= available:
            return MemoryCheck(found, available, total, fitting=changes)
    return MemoryCheck(found, available, total, verl=verl_plan(config, shape))
