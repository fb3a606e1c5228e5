"""Train-step throughput: dapo-suite's `DAPOTrainer.actor.update` against TRL's `GRPOTrainer` configured for
DAPO.

TRL lives in an environment of its own (it breaks verl's model building: pyproject.toml, the `bench` extra):
    bash scripts/bootstrap.sh .venv-bench && .venv-bench/bin/pip install -e '.[bench]'
then run this file with .venv-bench/bin/python in place of .venv/bin/python:
    .venv/bin/python -m benchmarks.train_step                    # 4 prompts x 8 responses, micro-batch 8
    .venv/bin/python -m benchmarks.train_step --prompts 2 --group-size 4 --prompt-len 32 --response-len 16
    --reps 1 .venv/bin/python -m benchmarks.train_step --bf16       # both in bf16 mixed precision (f32
    weights and AdamW)

One DAPO update on the embedded SmolLM2-135M-Instruct, in one process, over the same pre-built rollouts (no
generation is timed for either): prompts*group_size responses of about --prompt-len prompt tokens and up to
--response-len response tokens, --truncated-fraction of them cut at the limit (no end-of-sequence token), one
AdamW step over micro-batches of --micro-batch. The same settings on both sides: eps_low 0.2, eps_high 0.28,
dual-clip c = 10 (TRL's `delta`), token-level loss over the whole mini-batch, truncated responses masked, no
KL, temperature 1, the same lr, weight decay 0.1 and grad clip 1.0, float32, no gradient checkpointing (TRL
defaults to it; it trades time for memory that this model does not need). Each side keeps its own optimizer:
TRL's default `adamw_torch_fused` without decay on biases and norms, ours fused `torch.optim.AdamW`.

- ours: `Actor.update(groups)` of a `DAPOTrainer`, the real trainer (one mini-batch = all groups).
- TRL: `GRPOTrainer(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, mask_truncated_completions=True,
  beta=0.0,
  delta=10)`; its `_prepare_inputs` (generation + scoring) is replaced by the prepared batch, then its own
  `training_step` per micro-batch (forward with its fused LM head, `_compute_loss`, backward), gradient
  clipping, optimizer and scheduler step, as `Trainer`'s inner loop does them.

Loss check: from the same initial weights, old log-probs (log pi_theta plus noise, so ratios spread around 1
and both clip sides act) and advantages, the first step's loss and pre-clip gradient norm of both must agree.
Conventions: TRL divides each micro-batch's sum by `num_items_in_batch * grad_accum / steps_per_generation`
(the generation batch's unmasked completion tokens, per process), ours by the mini-batch's unmasked response
tokens: the same denominator here, one process, one generation batch = one mini-batch. TRL applies the
truncation mask while generating (which this benchmark skips), so the prepared batch applies it exactly as TRL
does (last token not EOS/pad). Timing: warm-up step (the loss check), then --reps steps of each, interleaved;
tokens/s counts real (unpadded) prompt + response tokens, truncated responses included (both sides run them).
Target: ours >= 3x TRL (issue #77). --bf16: both sides compute under bf16 autocast with float32 weights and
optimizer state (ours `autocast_dtype= bfloat16`, TRL `bf16=True`; run without --bf16 for the float32
figures); the loss check then allows --rtol 1e-1 (the two sides round differently in bf16, and the loss is a
small mean of terms of both signs: the gaps measured are in docs/results/precision/history.md; the float32 run
is the check that both compute the same loss). With overlong filtering, `update` leaves truncated responses
out of its forward and backward passes (they carry no loss and no gradient); TRL runs them and masks their
loss.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from dapo_suite.core.provenance import cpu_line
from dapo_suite.train.algorithm import ScoredGroups, group_advantages
from dapo_suite.train.rollout import Rollout

TARGET = 3.0  # ours over TRL's update tokens/s, equal settings (issue #77)


def synthetic_groups(
    prompts: int,
    group_size: int,
    prompt_len: int,
    response_len: int,
    vocab_size: int,
    eos_id: int,
    seed: int,
    prompt_jitter: int = 0,
    truncated_fraction: float = 0.0,
    min_response_len: int | None = None,
) -> list[list[Rollout]]:
    """Random prompts and responses (token content does not change the cost): prompts of prompt_len +- jitter
    tokens, responses of min_response_len (default response_len // 2) to response_len tokens ending at EOS, or
    truncated at response_len without it; advantages from +-1 rewards with every group mixed. old_log_prob is
    filled in later."""
    gen = torch.Generator().manual_seed(seed)
    shortest = response_len // 2 if min_response_len is None else min_response_len
    groups = []
    for g in range(prompts):
        length = prompt_len + int(torch.randint(-prompt_jitter, prompt_jitter + 1, (1,), generator=gen))
        prompt = torch.randint(100, vocab_size, (length,), generator=gen)
        group = []
        for i in range(group_size):
            truncated = bool(torch.rand((), generator=gen) < truncated_fraction)
            size = (
                response_len
                if truncated
                else int(torch.randint(shortest, response_len + 1, (1,), generator=gen))
            )
            response = torch.randint(100, vocab_size, (size,), generator=gen)
            if not truncated:
                response[-1] = eos_id
            group.append(
                Rollout(
                    group=g,
                    prompt_ids=prompt,
                    response_ids=response,
                    old_log_prob=None,
                    truncated=truncated,
                    text="",
                    score=1.0 if i % 2 else -1.0,
                )
            )
        groups.append(group)
    flat = [r for group in groups for r in group]
    advantages = group_advantages(
        ScoredGroups.of(torch.tensor([r.score for r in flat]), [r.group for r in flat])
    )
    for rollout, advantage in zip(flat, advantages.tolist(), strict=True):
        rollout.reward, rollout.advantage = rollout.score, advantage
    return groups


@torch.no_grad()
def fill_old_log_probs(
    trainer, groups: list[list[Rollout]], micro_batch: int, noise: float, seed: int
) -> None:
    """log pi_old = log pi_theta(initial weights) + N(0, noise^2) per token: ratios != 1, so clipping acts."""
    gen = torch.Generator().manual_seed(seed + 1)
    flat = [r for group in groups for r in group]
    for start in range(0, len(flat), micro_batch):
        micro = flat[start : start + micro_batch]
        log_prob, _, _ = trainer.actor.forward_log_probs(micro)
        for row, rollout in zip(log_prob, micro, strict=True):
            rollout.old_log_prob = row[: rollout.length].clone() + noise * torch.randn(
                rollout.length, generator=gen
            )


def trl_inputs(groups: list[list[Rollout]], micro_batch: int, pad_id: int, eos_ids: list[int]) -> list[dict]:
    """The dict `GRPOTrainer._generate_and_score_completions` returns, padded over the generation batch as TRL
    pads it (prompts left, completions right), then split into micro-batches in order."""
    flat = [r for group in groups for r in group]
    prompt_len = max(r.prompt_ids.numel() for r in flat)
    completion_len = max(r.length for r in flat)
    prompt_ids = torch.full((len(flat), prompt_len), pad_id)
    prompt_mask = torch.zeros(len(flat), prompt_len, dtype=torch.long)
    completion_ids = torch.full((len(flat), completion_len), pad_id)
    completion_mask = torch.zeros(len(flat), completion_len, dtype=torch.long)
    old = torch.zeros(len(flat), completion_len)
    for i, r in enumerate(flat):
        p = r.prompt_ids.numel()
        prompt_ids[i, prompt_len - p :], prompt_mask[i, prompt_len - p :] = r.prompt_ids, 1
        completion_ids[i, : r.length], completion_mask[i, : r.length] = r.response_ids, 1
        old[i, : r.length] = r.old_log_prob
    # mask_truncated_completions, as TRL does it: truncated = last completion token is neither EOS nor pad.
    is_truncated = torch.tensor([int(r.response_ids[-1]) not in [*eos_ids, pad_id] for r in flat])
    assert is_truncated.tolist() == [r.truncated for r in flat], "truncation flags disagree with TRL's rule"
    completion_mask = completion_mask * (~is_truncated).unsqueeze(1).int()
    num_items_in_batch = completion_mask.sum()
    advantages = torch.tensor([r.advantage for r in flat])
    return [
        {
            "prompt_ids": prompt_ids[s : s + micro_batch],
            "prompt_mask": prompt_mask[s : s + micro_batch],
            "completion_ids": completion_ids[s : s + micro_batch],
            "completion_mask": completion_mask[s : s + micro_batch],
            "advantages": advantages[s : s + micro_batch],
            "old_per_token_logps": old[s : s + micro_batch],
            "num_items_in_batch": num_items_in_batch,
        }
        for s in range(0, len(flat), micro_batch)
    ]


def build_trl(args, model_path: str, out: str, num_micro: int, bf16: bool):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=out,
        report_to="none",
        use_cpu=True,
        bf16=bf16,
        gradient_checkpointing=False,
        seed=args.seed,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        delta=10.0,
        mask_truncated_completions=True,
        beta=0.0,
        temperature=1.0,
        num_generations=args.group_size,
        max_completion_length=args.response_len,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=num_micro,
        steps_per_generation=num_micro,
        learning_rate=args.lr,
        weight_decay=0.1,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
    )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    dataset = Dataset.from_dict({"prompt": ["1+1="] * args.prompts})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=args.reps + 1)
    trainer._prepare_inputs = lambda inputs: inputs  # no generation: the batch is already prepared
    return trainer


def trl_step(trainer, micro_inputs: list[dict]) -> tuple[float, float]:
    """One optimizer update the way `Trainer`'s inner loop runs it, minus callbacks and logging."""
    model = trainer.model
    trainer.current_gradient_accumulation_steps = len(micro_inputs)
    loss = 0.0
    for i, inputs in enumerate(micro_inputs):
        trainer.accelerator.gradient_state._set_sync_gradients(i == len(micro_inputs) - 1)
        loss += float(trainer.training_step(model, inputs, None))
    grad_norm = float(trainer._clip_grad_norm(model))
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    model.zero_grad()
    return loss, grad_norm


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=4, help="groups in the mini-batch")
    parser.add_argument("--group-size", type=int, default=8, help="G: responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=100, help="mean prompt tokens")
    parser.add_argument("--prompt-jitter", type=int, default=8, help="prompt lengths vary by +- this much")
    parser.add_argument(
        "--response-len", type=int, default=64, help="L_max; others uniform in [L_max/2, L_max]"
    )
    parser.add_argument(
        "--truncated-fraction", type=float, default=0.25, help="responses cut at L_max, masked"
    )
    parser.add_argument("--micro-batch", type=int, default=8, help="responses per forward/backward")
    parser.add_argument("--reps", type=int, default=3, help="timed steps of each, after one warm-up step")
    parser.add_argument("--noise", type=float, default=0.3, help="std of log pi_old - log pi_theta")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument(
        "--rtol", type=float, help="loss check tolerance (relative; default 1e-4, 1e-1 with --bf16)"
    )
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision on both sides")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.rtol = args.rtol if args.rtol is not None else (1e-1 if args.bf16 else 1e-4)
    total = args.prompts * args.group_size
    if total % args.micro_batch:
        parser.error(
            f"prompts * group_size ({total}) must be a multiple of --micro-batch ({args.micro_batch})"
        )
    num_micro = total // args.micro_batch

    import transformers
    import trl

    from dapo_suite.inference.models import embedded_model_path
    from dapo_suite.train.config import resolve_config
    from dapo_suite.train.trainer import DAPOTrainer

    transformers.logging.set_verbosity_error()
    model_path = str(embedded_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        # as `--set` settings: autocast_dtype None turns off the default scale's `auto` (bf16 where native)
        config = resolve_config(
            ["dapo"],
            settings={
                "out": f"{tmp}/ours",
                "seed": args.seed,
                "train_batch_size": args.prompts,
                "mini_batch_size": args.prompts,
                "micro_batch_size": args.micro_batch,
                "group_size": args.group_size,
                "max_response_length": args.response_len,
                "overlong_buffer_len": max(1, args.response_len // 4),
                "clip_low": 0.2,
                "clip_high": 0.28,
                "clip_c": 10.0,
                "loss_agg": "token-mean",
                "overlong_filter": True,
                "lr": args.lr,
                "warmup_steps": 0,
                "weight_decay": 0.1,
                "grad_clip": 1.0,
                "temperature": 1.0,
                "dtype": "float32",
                "autocast_dtype": "bfloat16" if args.bf16 else None,
                "device": "cpu",
            },
        )
        ours = DAPOTrainer(config)
        ran = ours.actor.config.autocast_dtype
        assert ran == ("bfloat16" if args.bf16 else None), f"ours runs autocast {ran}, not the side asked for"
        tokenizer = ours.tokenizer
        groups = synthetic_groups(
            args.prompts,
            args.group_size,
            args.prompt_len,
            args.response_len,
            ours.model.config.vocab_size,
            tokenizer.eos_token_id,
            args.seed,
            args.prompt_jitter,
            args.truncated_fraction,
        )
        fill_old_log_probs(ours, groups, args.micro_batch, args.noise, args.seed)
        trainer = build_trl(args, model_path, f"{tmp}/trl", num_micro, args.bf16)
        micro_inputs = trl_inputs(groups, args.micro_batch, tokenizer.pad_token_id, trainer.eos_token_ids)

        flat = [r for group in groups for r in group]
        tokens = sum(r.prompt_ids.numel() + r.length for r in flat)
        print(
            f"[train-step] torch {torch.__version__}, transformers {transformers.__version__}, trl "
            f"{trl.__version__}, {torch.get_num_threads()} threads; {cpu_line()}"
        )
        print(
            f"[train-step] {args.prompts} prompts x {args.group_size} responses = {total}; {tokens} tokens "
            f"(prompt ~{args.prompt_len}, response <= {args.response_len}, {sum(r.truncated for r in flat)} "
            f"truncated), micro-batch {args.micro_batch}, one optimizer update, "
            f"{'bf16 autocast' if args.bf16 else 'float32'}"
        )

        # Warm-up step from identical weights: the loss check.
        metrics = ours.actor.update(groups)
        ours_loss, ours_norm = metrics["actor/pg_loss"], metrics["actor/grad_norm"]
        trl_loss, trl_norm = trl_step(trainer, micro_inputs)
        loss_rel = abs(ours_loss - trl_loss) / max(abs(trl_loss), 1e-12)
        norm_rel = abs(ours_norm - trl_norm) / max(abs(trl_norm), 1e-12)
        print(f"[loss check] ours loss {ours_loss:+.8f}  TRL loss {trl_loss:+.8f}  rel diff {loss_rel:.1e}")
        print(
            f"[loss check] ours grad norm {ours_norm:.6f}  TRL grad norm {trl_norm:.6f}  rel diff "
            f"{norm_rel:.1e}"
        )
        print(f"[loss check] clipped token fraction (ours): {metrics['actor/pg_clipfrac']:.3f}")
        assert loss_rel <= args.rtol, f"losses differ by {loss_rel:.2e} relative (> {args.rtol})"
        assert norm_rel <= 10 * args.rtol, (
            f"gradient norms differ by {norm_rel:.2e} relative (> {10 * args.rtol})"
        )

        steps = {"ours": lambda: ours.actor.update(groups), "TRL": lambda: trl_step(trainer, micro_inputs)}
        seconds: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.reps):  # interleaved, so background load hits all alike
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                seconds[name].append(time.perf_counter() - start)
        ours.logger.close()

    rates = {}
    for name, times in seconds.items():
        rates[name] = tokens / statistics.median(times)
        steps = ", ".join(f"{t:.2f}" for t in times)
        print(
            f"[train-step] {name:<7} step seconds [{steps}]  median {statistics.median(times):.2f} s = "
            f"{rates[name]:,.0f} tokens/s"
        )
    ratio = rates["ours"] / rates["TRL"]
    print(
        f"[train-step] ratio ours / TRL = {ratio:.3f}x (target >= {TARGET}x): "
        f"{'met' if ratio >= TARGET else 'missed'}; load average now {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
