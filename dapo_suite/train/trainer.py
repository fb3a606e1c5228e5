"""The embedded DAPO trainer: one process, CPU or one GPU, every technique of the paper switchable.

    dapo-suite train --preset dapo --out runs/dapo          # the embedded default on a CPU

One step (`DAPOTrainer.step`):
1. rollout: sample G responses per prompt, generation batch after generation batch;
2. reward: +1/-1 correctness (`reward.compute_score`) plus the soft overlong penalty (eq. 13);
3. dynamic sampling: keep groups with 0 < accuracy < 1 until `train_batch_size` prompts are kept (eq. 11);
4. advantages over the training batch: group-normalised rewards (eq. 9), or another estimator
   (`adv_estimator`), the same for every token of a response;
5. update: mini-batches of `mini_batch_size` prompts, each one AdamW step over micro-batches whose token-mean
   divides by the mini-batch's token count; truncated responses masked when overlong filtering is on; the loss
   is DAPO's or a successor's (`loss_mode`), with rollout-correction weights when the sampler's log-probs are
   not the trainer's (`rollout_correction`).
Deviations from the paper, all at small scale only: the tiny-cpu preset's learning rate and lengths (see
presets/tiny-cpu.yaml); when the generation-batch limit is hit the step trains on the mixed groups it found
(verl's recipe stops the run with "Generated too many").
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dapo_suite.core.errors import UserError
from dapo_suite.core.problems import Problem
from dapo_suite.core.prompts import chat_messages, render_chat
from dapo_suite.core.reward import UNCHECKED, compute_score, extract_answer
from dapo_suite.inference.models import load_model_and_tokenizer, resolve_precision, weights_dtype
from dapo_suite.inference.tool_loop import tool_use
from dapo_suite.train.actor import Actor
from dapo_suite.train.algorithm import (
    compute_advantages,
    mixed_groups,
    soft_overlong_penalty,
    tool_call_shaping,
)
from dapo_suite.train.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    require_finite,
    save_checkpoint,
    verify_checkpoint,
)
from dapo_suite.train.config import TrainConfig
from dapo_suite.train.evaluate import heldout_accuracy_of
from dapo_suite.train.lora import ADAPTER_WEIGHTS, adapter_state, add_adapters, load_adapter_state
from dapo_suite.train.rollout import Rollout, make_engine, sample_rollouts
from dapo_suite.train.run_log import MetricsLogger, read_metrics
from dapo_suite.train.tasks import train_and_heldout
from dapo_suite.train.verdict import learning_verdict

log = logging.getLogger("dapo_suite.train")
REDUCED_PRECISIONS = (
    "bfloat16",
    "float16",
)  # sampled in these, log-probs differ from the trainer's by rounding


@dataclass
class PromptSampler:
    """Walks the training problems in a seeded shuffled order, epoch after epoch; its state is one int."""

    problems: list[Problem]
    seed: int
    cursor: int = 0

    def next(self, count: int) -> list[Problem]:
        picked = []
        for _ in range(count):
            epoch, position = divmod(self.cursor, len(self.problems))
            order = list(range(len(self.problems)))
            random.Random(self.seed + epoch).shuffle(order)
            picked.append(self.problems[order[position]])
            self.cursor += 1
        return picked


def keeps_group(group: list[Rollout], metric: str) -> bool:
    """Dynamic sampling's test for one group: mixed accuracy (`acc`, the paper) or a non-constant reward
    (`reward`, `Rollout.reward`: verl's "reward" metric, which also keeps uniform-accuracy groups that the
    length penalty splits)."""
    if metric == "acc":
        return bool(mixed_groups(torch.tensor([r.acc for r in group]), [0] * len(group))[0])
    return len({r.reward for r in group}) > 1


def filter_groups(
    groups: list[list[Rollout]], dynamic_sampling: bool, metric: str
) -> tuple[list[list[Rollout]], dict[str, int]]:
    """The groups a generation batch contributes, and how many were all-correct, all-wrong or mixed, and how
    many had zero advantage (a constant reward: no gradient), all counted before filtering."""
    counts = {"all_correct": 0, "all_wrong": 0, "mixed": 0, "zero_advantage": 0}
    kept = []
    for group in groups:
        accuracy = sum(r.acc for r in group) / len(group)
        counts["all_correct" if accuracy == 1 else "all_wrong" if accuracy == 0 else "mixed"] += 1
        counts["zero_advantage"] += not keeps_group(group, "reward")
        if not dynamic_sampling or keeps_group(group, metric):
            kept.append(group)
    return kept, counts


def sampled_entropy(rollouts: list[Rollout]) -> dict[str, float]:
    """`rollout/entropy`: the mean entropy of the distributions every sampled response token (the model's own)
    was drawn from, trained or not: what `actor/entropy`, over the trained tokens only, leaves out when
    overlong filtering drops truncated responses or dynamic sampling drops groups. Empty when the engine gives
    none (vLLM)."""
    parts = [(r.sampled_entropy * r.mask).sum() for r in rollouts if r.sampled_entropy is not None]
    tokens = sum(r.model_length for r in rollouts if r.sampled_entropy is not None)
    return {"rollout/entropy": float(sum(parts)) / tokens} if parts and tokens else {}


def tool_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """`tool/*` over a step's sampled responses: calls per response, the share that call the tool, calls that
    failed (an exception, a non-zero exit, a limit) and timed out, model turns, and tokens the tool wrote."""
    use = tool_use([[call.outcome for call in r.tool_calls] for r in rollouts])
    count = max(len(rollouts), 1)
    return {
        "tool/calls_per_response": use["calls_per_response"],
        "tool/call_rate": use["call_rate"],
        "tool/errors": use["failed_calls"],
        "tool/error_rate": use["failed_call_rate"] or 0.0,
        "tool/timeouts": use["timeouts"],
        "tool/turns_mean": sum(len(r.tool_calls) + 1 for r in rollouts) / count,
        "tool/tokens_mean": sum(r.length - r.model_length for r in rollouts) / count,
    }


def logprob_mismatch(rollouts: list[Rollout]) -> dict[str, float]:
    """|log pi_old (trainer) - log pi_rollout (sampler)| over the response tokens of rollouts that carry both:
    the rollout-training mismatch that rollout correction weighs. Empty when none carries both."""
    both = [
        r
        for r in rollouts
        if r.rollout_log_prob is not None and r.old_log_prob is not None and r.model_length
    ]
    if not both:
        return {}
    gap = torch.cat([(r.old_log_prob - r.rollout_log_prob).abs()[r.mask > 0] for r in both])
    return {"rollout/logprob_diff_max": gap.max().item(), "rollout/logprob_diff_mean": gap.mean().item()}


class DAPOTrainer:
    def __init__(self, config: TrainConfig, resume: bool = False) -> None:
        self.config = config
        self.run_dir = Path(config.out)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        device = config.device if config.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        device_type = torch.device(device).type
        # "auto" precisions become what this machine runs (and config.yaml records that).
        self.config = config = replace(
            config,
            dtype=weights_dtype(config.dtype, config.lora_rank > 0, device_type),
            sampling_dtype=resolve_precision(config.sampling_dtype, device_type),
            autocast_dtype=resolve_precision(config.autocast_dtype, device_type),
        )
        self.model, self.tokenizer = load_model_and_tokenizer(config.model, dtype=config.dtype, device=device)
        self.model.config.use_cache = True
        if config.gradient_checkpointing:  # in train mode only: sampling and evaluation run as before
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # LoRA: PEFT injects the adapters into self.model, which still runs every forward pass and feeds the
        # sampler; `self.adapters` (the PEFT wrapper) saves and loads them. None: full fine-tuning.
        self.adapters = add_adapters(self.model, config) if config.lora_rank else None
        self.engine = make_engine(config, self.model, self.tokenizer)
        self.actor = Actor(self.model, self.tokenizer.pad_token_id, config)
        self.train_problems, self.heldout = self._load_data()
        self.sampler = PromptSampler(self.train_problems, seed=config.seed)
        self.surplus: list[list[Rollout]] = []
        self.step_index = 0
        if resume:
            self._resume()
        config.save(self.run_dir / "config.yaml")
        self.logger = MetricsLogger(self.run_dir, config, truncate_after_step=self.step_index)

    # ---- data --------------------------------------------------------------------------------------------

    def _load_data(self) -> tuple[list[Problem], list[Problem]]:
        return train_and_heldout(self.config)

    def prompt_text(self, problem: Problem) -> str:
        return render_chat(
            self.tokenizer,
            chat_messages(problem.problem, shots=self.config.prompt_shots, tools=self.config.multi_turn),
        )

    # ---- rollout, reward, dynamic sampling ---------------------------------------------------------------

    def score(self, rollouts: list[Rollout], problems: list[Problem]) -> Counter:
        """Correctness reward plus the soft overlong penalty; returns how many answers the checker could not
        check, by why (`timeout`, `too_complex`: scored -1 and logged as `reward/timeouts` and
        `reward/too_complex`, so a run tells "wrong" from "could not check")."""
        config = self.config
        unchecked: Counter = Counter()
        for (
            rollout
        ) in rollouts:  # the model's own text: an answer line a tool printed is not the model's answer
            result = compute_score("dapo-suite", rollout.graded_text, problems[rollout.group].answer)
            rollout.score, rollout.acc = result["score"], result["acc"]
            unchecked.update(reason for reason in UNCHECKED if result[reason])
        # The penalty counts the model's own tokens: a tool's long output is not the model's verbosity.
        lengths = torch.tensor([r.model_length for r in rollouts])
        penalty = (
            soft_overlong_penalty(
                lengths,
                config.max_response_length,
                config.overlong_buffer_len,
                config.overlong_penalty_factor,
            )
            if config.overlong_penalty
            else torch.zeros(len(rollouts))
        )
        if config.tool_call_bonus:
            shaped = tool_call_shaping(
                torch.tensor([r.score for r in rollouts]),
                torch.tensor([r.acc for r in rollouts]),
                torch.tensor([len(r.tool_calls) for r in rollouts]),
                config.tool_call_bonus,
                config.tool_call_bonus_cap,
            )
            for rollout, score in zip(rollouts, shaped.tolist(), strict=True):
                rollout.score = score
        rewards = torch.tensor([r.score for r in rollouts]) + penalty
        for rollout, reward in zip(rollouts, rewards.tolist(), strict=True):
            rollout.reward = reward
        return unchecked

    def assign_advantages(self, groups: list[list[Rollout]]) -> None:
        """Advantages over the batch that trains (eq. 9 for grpo), so that batch-level statistics (Lite PPO's
        std, REINFORCE++'s whitening) are over the training batch, as in verl."""
        rollouts = [r for group in groups for r in group]
        advantages = compute_advantages(
            self.config.adv_estimator,
            torch.tensor([r.reward for r in rollouts]),
            [index for index, group in enumerate(groups) for _ in group],
            torch.tensor([r.model_length for r in rollouts]),
            self.config.adv_norm,
        )
        for rollout, advantage in zip(rollouts, advantages.tolist(), strict=True):
            rollout.advantage = advantage

    def collect(self) -> tuple[list[list[Rollout]], dict[str, float]]:
        """Generation batches until `train_batch_size` groups are kept; returns the groups and sampling
        metrics."""
        config = self.config
        kept, reused = list(self.surplus), len(self.surplus)
        self.surplus = []
        counts = {"all_correct": 0, "all_wrong": 0, "mixed": 0, "zero_advantage": 0}
        gen_batches, generated_tokens, rollout_seconds, all_rollouts = 0, 0, 0.0, []
        unchecked: Counter = Counter()
        while len(kept) < config.train_batch_size:
            if config.max_num_gen_batches and gen_batches >= config.max_num_gen_batches:
                log.warning(
                    "step %d: %d generation batches gave %d/%d prompts with mixed outcomes; training on "
                    "those (raise max_num_gen_batches or gen_batch_size, or lower train_batch_size)",
                    self.step_index + 1,
                    gen_batches,
                    len(kept),
                    config.train_batch_size,
                )
                break
            problems = self.sampler.next(
                config.gen_batch_size if config.dynamic_sampling else config.train_batch_size - len(kept)
            )
            start = time.monotonic()
            rollouts = sample_rollouts(
                self.engine,
                self.tokenizer,
                [self.prompt_text(p) for p in problems],
                config.group_size,
                config.max_response_length,
                config.temperature,
                config.top_p,
            )
            rollout_seconds += time.monotonic() - start
            gen_batches += 1
            generated_tokens += sum(r.length for r in rollouts)
            unchecked += self.score(rollouts, problems)
            all_rollouts += rollouts
            groups = [[r for r in rollouts if r.group == g] for g in range(len(problems))]
            new_groups, new_counts = filter_groups(groups, config.dynamic_sampling, config.filter_metric)
            kept += new_groups
            counts = {key: counts[key] + new_counts[key] for key in counts}
        surplus = kept[config.train_batch_size :]
        kept = kept[: config.train_batch_size]
        if config.reuse_surplus_groups:
            self.surplus = surplus
        # Only for the groups that will train, and before any update: surplus groups kept for a later step
        # must carry the behaviour policy's log-probs, not the later policy's (groups reused from earlier have
        # theirs).
        self.fill_old_log_probs([r for group in kept + self.surplus for r in group])
        if kept:
            self.assign_advantages(kept)
        mismatch = logprob_mismatch([r for group in kept for r in group])
        lengths = torch.tensor([r.model_length for r in all_rollouts], dtype=torch.float32)
        metrics = {
            "reward/mean": sum(r.reward for r in all_rollouts) / len(all_rollouts),
            "reward/acc": sum(r.acc for r in all_rollouts) / len(all_rollouts),
            "reward/format_rate": sum(extract_answer(r.text) is not None for r in all_rollouts)
            / len(all_rollouts),
            "reward/timeouts": unchecked["timeout"],
            "reward/too_complex": unchecked["too_complex"],
            "response_len/mean": lengths.mean().item(),
            "response_len/max": lengths.max().item(),
            "response_len/clip_ratio": sum(r.truncated for r in all_rollouts) / len(all_rollouts),
            "sampling/gen_batches": gen_batches,
            "sampling/groups_kept": len(kept),
            "sampling/groups_all_correct": counts["all_correct"],
            "sampling/groups_all_wrong": counts["all_wrong"],
            "sampling/groups_mixed": counts["mixed"],
            "sampling/groups_zero_advantage": counts["zero_advantage"],
            "sampling/groups_reused": reused,
            "sampling/groups_surplus_kept": len(self.surplus),
            "sampling/groups_surplus_dropped": len(surplus) - len(self.surplus),
            "perf/rollout_tokens_per_s": generated_tokens / max(rollout_seconds, 1e-9),
        }
        metrics.update(mismatch | sampled_entropy(all_rollouts))
        if config.multi_turn:
            metrics.update(tool_metrics(all_rollouts))
        return kept, metrics

    # ---- policy update -----------------------------------------------------------------------------------

    def corrects_rollouts(self) -> bool:
        """Rollout correction on: `on`, or `auto` when the sampler's log-probs are not the trainer's: another
        sampling dtype, a reduced one (the sampler's bf16 kernels round otherwise than the trainer's, even
        over a bf16 LoRA base), quantized rollout weights, or vLLM's kernels."""
        if self.config.rollout_correction != "auto":
            return self.config.rollout_correction == "on"
        sampling = self.config.sampling_dtype or self.config.dtype
        return (
            sampling != self.config.dtype
            or sampling in REDUCED_PRECISIONS
            or self.config.rollout_quantization is not None
            or self.engine.name == "vllm"
        )

    @torch.no_grad()
    def fill_old_log_probs(self, rollouts: list[Rollout]) -> None:
        """log pi_old from the trainer's own forward pass for rollouts whose engine did not return it (vLLM),
        and, with rollout correction on, for every rollout, keeping the sampler's as `rollout_log_prob`."""
        if self.corrects_rollouts():
            for rollout in rollouts:
                if rollout.rollout_log_prob is None and rollout.old_log_prob is not None:
                    rollout.rollout_log_prob, rollout.old_log_prob = rollout.old_log_prob, None
        self.actor.old_log_probs([r for r in rollouts if r.old_log_prob is None])

    # ---- the loop ----------------------------------------------------------------------------------------

    def step(self) -> dict[str, float]:
        start = time.monotonic()
        groups, metrics = self.collect()
        rollout_done = time.monotonic()
        if groups:
            metrics.update(self.actor.update(groups))
            self.engine.sync_weights()
        else:
            log.warning("step %d: no prompt had mixed outcomes; no update this step", self.step_index + 1)
        update_seconds = time.monotonic() - rollout_done
        metrics["perf/update_tokens_per_s"] = metrics.get("perf/trained_tokens", 0) / max(
            update_seconds, 1e-9
        )
        metrics["perf/step_seconds"] = time.monotonic() - start
        self.step_index += 1
        return metrics

    def evaluate(self) -> dict[str, float]:
        prompts = [self.prompt_text(p) for p in self.heldout]
        return heldout_accuracy_of(self.engine, prompts, [p.answer for p in self.heldout], self.config)

    def fit(self, progress: bool = True) -> dict[str, float]:
        from tqdm import tqdm

        config = self.config
        summary_path = self.run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        evaluates = bool(self.heldout) and config.heldout_eval
        if "before" not in summary and evaluates:
            summary["before"] = self.evaluate()
            summary_path.write_text(json.dumps(summary, indent=2))
            self.logger.log(self.step_index, {f"val/{k}": v for k, v in summary["before"].items()})
        bar = tqdm(total=config.max_steps, initial=self.step_index, desc="DAPO steps", disable=not progress)
        while self.step_index < config.max_steps:
            metrics = self.step()
            if (
                evaluates
                and config.eval_every
                and self.step_index % config.eval_every == 0
                and self.step_index < config.max_steps
            ):
                metrics.update({f"val/{k}": v for k, v in self.evaluate().items()})
            self.logger.log(self.step_index, metrics)
            if self.step_index % config.save_every == 0 or self.step_index == config.max_steps:
                self.save()
            bar.update(1)
            # A step without mixed groups makes no update: it has no loss to show, so say so instead of nan.
            loss = metrics.get("actor/pg_loss", math.nan)
            bar.set_postfix(
                acc=f"{metrics['reward/acc']:.2f}",
                kept=metrics["sampling/groups_kept"],
                loss="no update" if math.isnan(loss) else f"{loss:+.3f}",
            )
        bar.close()
        # A finished run resumed with a larger --max-steps trained on: its old "after" is of an earlier step.
        if evaluates and ("after" not in summary or summary.get("steps") != self.step_index):
            summary["after"] = self.evaluate()
            self.logger.log(self.step_index, {f"val/{k}": v for k, v in summary["after"].items()})
        summary["steps"] = self.step_index
        self.logger.close()
        if evaluates:
            verdict = learning_verdict(
                summary["before"], summary["after"], read_metrics(self.run_dir), config.train_batch_size
            )
            summary["verdict"] = {"learned": verdict.learned, "text": verdict.text()}
        summary_path.write_text(json.dumps(summary, indent=2))
        return summary

    # ---- checkpoints -------------------------------------------------------------------------------------

    def save(self) -> Path:
        state = {
            "step": self.step_index,
            "optimizer": self.actor.optimizer.state_dict(),
            "scheduler": self.actor.scheduler.state_dict(),
            "sampler_cursor": self.sampler.cursor,
            "surplus": self.surplus,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }
        return save_checkpoint(
            self.run_dir,
            self.step_index,
            self.adapters or self.model,
            self.tokenizer,
            state,
            keep=self.config.keep_checkpoints,
        )

    def _resume(self) -> None:
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            log.info("no checkpoint in %s: starting from step 0", self.run_dir)
            return
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        verify_checkpoint(checkpoint)
        file = ADAPTER_WEIGHTS if self.adapters else "model.safetensors"
        if not (checkpoint / file).is_file():
            raise UserError(
                f"--resume: {checkpoint} holds no {file}: it was written by a "
                f"{'full fine-tuning' if self.adapters else 'LoRA'} run; resume with that run's "
                "lora_rank, or pick another --out for a new run."
            )
        try:
            weights = load_file(checkpoint / file)
        except (SafetensorError, OSError) as error:
            raise UserError(
                f"--resume: {checkpoint / file} cannot be read ({error}); move {checkpoint.name} out of "
                f"{checkpoint.parent} and rerun with --resume to continue from the checkpoint before it"
            ) from None
        require_finite(checkpoint, file, weights)
        own = adapter_state(self.adapters) if self.adapters else self.model.state_dict()
        differ = [
            f"{name} {tuple(tensor.shape)} vs {tuple(own[name].shape)}"
            for name, tensor in weights.items()
            if name in own and tensor.shape != own[name].shape
        ]
        if differ:
            raise UserError(
                f"--resume: {checkpoint} was written by another model ({len(differ)} tensors differ in "
                f"shape, e.g. {differ[0]}, checkpoint vs --model {self.config.model}); resume with that "
                "run's --model, or pick another --out for a new run."
            )
        if self.adapters:
            load_adapter_state(self.adapters, weights)
        else:
            # Tied embeddings are stored once; strict=False lets the tied lm_head keep pointing at them.
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if unexpected or any("lm_head" not in key for key in missing):
                raise RuntimeError(
                    f"checkpoint {checkpoint} does not match the model: missing {missing}, "
                    f"unexpected {unexpected}"
                )
        state = load_trainer_state(checkpoint)
        self.actor.optimizer.load_state_dict(state["optimizer"])
        self.actor.scheduler.load_state_dict(state["scheduler"])
        self.sampler.cursor = state["sampler_cursor"]
        self.surplus = state["surplus"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.step_index = state["step"]
        self.engine.sync_weights()
        log.info("resumed from %s (step %d)", checkpoint, self.step_index)
