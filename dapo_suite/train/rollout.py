"""Rollouts: G sampled responses per prompt as `Rollout` records, from the sampling engine the config names.

The trainer samples through the one engine protocol (`dapo_suite.inference.engines`): `sample_rollouts` turns
a batch of prompts into requests and the completions into rollouts, and `make_engine` builds the engine on the
trainer's own policy. The HF engine returns the behaviour log-probs from the same forward passes, so no extra
forward is needed for pi_old; vLLM returns none and the trainer recomputes pi_old, as verl does, because
vLLM's kernels differ numerically from the ones the trainer differentiates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from dapo_suite.inference.engines import Completion, HFEngine, Request, Sampling, VLLMEngine
from dapo_suite.inference.models import choose_engine
from dapo_suite.inference.tool_loop import ToolEngine, ToolSettings

log = logging.getLogger(__name__)


@dataclass
class Rollout:
    """One sampled response. Token tensors are 1-D and unpadded."""

    group: int  # index of its prompt in the generation batch (responses of one prompt form a group)
    prompt_ids: torch.Tensor  # (P,)
    response_ids: torch.Tensor  # (T,) through the end-of-sequence token when there is one
    old_log_prob: torch.Tensor | None  # (T,) log pi_old of each response token, or None to recompute
    truncated: bool  # hit max_response_length without an end-of-sequence token
    text: str
    score: float = 0.0  # correctness reward, +1 / -1
    acc: bool = False
    reward: float = 0.0  # score + overlong penalty: what the advantage is computed from
    advantage: float = 0.0
    rollout_log_prob: torch.Tensor | None = None  # (T,) the sampler's own log-probs, kept when the trainer
    #   recomputes old_log_prob for rollout correction (they come from another dtype or engine)
    # (T,) 1 on the model's tokens, 0 on a tool's; None: all the model's
    response_mask: torch.Tensor | None = None
    tool_calls: tuple = ()  # tool_loop.ToolCall records of a multi-turn response
    model_text: str | None = None  # the model's own text, what is graded; None: `text`
    # (T,) the sampler's entropy at each token (0 on a tool's); HF only
    sampled_entropy: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Tokens of the whole response, the tool's included: what the forward pass runs over."""
        return int(self.response_ids.numel())

    @property
    def mask(self) -> torch.Tensor:
        """(T,) float: 1 on the tokens that carry loss, entropy and length (the model's own), 0 on a
        tool's."""
        return torch.ones(self.length) if self.response_mask is None else self.response_mask

    @property
    def model_length(self) -> int:
        """The model's own tokens: what the overlong penalty and the length metrics count (tools excluded)."""
        return self.length if self.response_mask is None else int(self.response_mask.sum())

    @property
    def graded_text(self) -> str:
        return self.text if self.model_text is None else self.model_text


def sample_rollouts(
    engine: HFEngine | VLLMEngine,
    tokenizer,
    prompts: list[str],
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[Rollout]:
    """`group_size` samples of each (already rendered) prompt, ordered by prompt, then sample. With `seed` the
    samples come from a generator of their own; without, from the engine's default stream (torch's global
    generator for the HF engine), so a training run's rollouts follow its seed."""
    requests = [
        Request(str(group), index, prompt)
        for group, prompt in enumerate(prompts)
        for index in range(group_size)
    ]
    completions: list[Completion] = []
    engine.generate(
        requests,
        Sampling(temperature, top_p, max_new_tokens, chat_template=False, seed=seed),
        completions.append,
    )
    prompt_ids = [
        torch.tensor(ids, dtype=torch.long)
        for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]
    ]
    completions.sort(key=lambda c: (int(c.problem_id), c.sample_index))
    return [
        Rollout(
            group=int(c.problem_id),
            prompt_ids=prompt_ids[int(c.problem_id)],
            response_ids=c.token_ids,
            old_log_prob=c.log_probs,
            truncated=c.finish_reason == "length",
            text=c.text,
            response_mask=c.response_mask,
            tool_calls=c.tool_calls,
            model_text=c.model_text,
            sampled_entropy=c.entropies,
        )
        for c in completions
    ]


def make_engine(config, model, tokenizer) -> HFEngine | VLLMEngine | ToolEngine:
    """The engine `config.rollout_engine` names, on the trainer's policy: "hf"; "vllm" (one GPU); or "auto",
    which is vLLM when it is installed and the policy is on a GPU, else "hf". On "auto", a vLLM that fails to
    start falls back to "hf" with a warning that carries the error; on "vllm" the error stops the run. With
    `multi_turn`, the hf engine inside the tool loop, with the sandbox of the tool config."""
    if config.multi_turn:
        return tool_engine(config, hf_engine(config, model, tokenizer))
    return single_turn_engine(config, model, tokenizer)


def tool_engine(config, inner: HFEngine) -> ToolEngine:
    from dapo_suite.core.sandbox import Sandbox
    from dapo_suite.core.sandbox.tool_config import sandbox_limits

    settings = ToolSettings(
        config.max_assistant_turns, config.max_tool_response_length, config.tool_response_truncate_side
    )
    return ToolEngine(
        inner, Sandbox(sandbox_limits(config.tool_config_path), isolation=config.tool_isolation), settings
    )


def single_turn_engine(config, model, tokenizer) -> HFEngine | VLLMEngine:
    if choose_engine(config.rollout_engine, on_gpu=model.device.type == "cuda") == "hf":
        return hf_engine(config, model, tokenizer)
    max_model_len = config.max_prompt_length + max(config.max_response_length, config.eval_max_tokens)
    try:
        return VLLMEngine.for_policy(model, max_model_len, config.rollout_gpu_memory_utilization, config.seed)
    except Exception as error:
        if config.rollout_engine == "vllm":
            raise
        log.warning(
            "vLLM did not start (%s: %s); sampling with transformers instead. Set rollout_engine=vllm "
            "to stop on this error, or rollout_engine=hf to skip vLLM.",
            type(error).__name__,
            error,
        )
        return hf_engine(config, model, tokenizer)


ROLLOUT_BATCH_ROWS = 128  # sequences sampled together (whole groups): the CPU's sweet spot, bounded memory


def hf_engine(config, model, tokenizer) -> HFEngine:
    return HFEngine(
        model,
        tokenizer,
        ROLLOUT_BATCH_ROWS,
        config.sampling_dtype,
        progress=False,
        quantization=config.rollout_quantization,
        kv_cache_dtype=config.rollout_kv_cache_dtype,
    )
