"""Where DAPO's problems can appear at the embedded scale: the untrained model (the study's one-example
prompt) on each built-in task, at several response limits. Per task and limit: the share of samples cut by the
limit, the share right when a response is cut there, the share with an `Answer:` line, and the prompts whose
group is mixed (the only groups with a gradient, eq. 11 of arXiv 2503.14476) or all wrong (no signal for
GRPO).

One sample per prompt and slot is drawn at the longest limit; a shorter limit keeps each response's first
tokens, which is what sampling with that limit draws from the same stream. The probe samples the training
split only (the held-out split of each seed is never looked at), so the setting it picks is chosen without the
held-out problems.

    python scripts/effects_probe.py --tasks word-problems-1,word-problems-2,word-problems-3 --limits
    32,48,64,96
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

import torch

from dapo_suite.core.prompts import chat_messages, render_chat
from dapo_suite.core.provenance import cpu_line
from dapo_suite.core.reward import compute_score, extract_answer
from dapo_suite.inference.models import load_model_and_tokenizer, resolve_precision
from dapo_suite.train.config import resolve_config
from dapo_suite.train.rollout import hf_engine, sample_rollouts
from dapo_suite.train.tasks import builtin_task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default="word-problems-1,word-problems-2,word-problems-3")
    parser.add_argument("--limits", default="32,48,64,96", help="response limits in tokens, ascending")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--shots", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    limits = sorted(int(limit) for limit in args.limits.split(","))
    config = resolve_config(["dapo"], {"out": "/dev/null"})
    config = replace(config, sampling_dtype=resolve_precision(config.sampling_dtype))
    model, tokenizer = load_model_and_tokenizer(None, dtype="float32", device="cpu")
    engine = hf_engine(config, model, tokenizer)
    print(cpu_line())
    print(
        f"{args.prompts} training problems per task x {args.group_size} samples, temperature "
        f"{config.temperature}, top_p {config.top_p}, {args.shots} format example(s), sampling in "
        f"{config.sampling_dtype or 'float32'}, seed {args.seed}"
    )
    print(
        "| task | limit (tokens) | cut by the limit | right | Answer: line | mixed groups | all-wrong groups "
        "| mean length | seconds |\n|---|---|---|---|---|---|---|---|---|"
    )
    for task in args.tasks.split(","):
        train, _ = builtin_task(task, heldout_size=100, seed=args.seed)
        problems = random.Random(args.seed).sample(train, args.prompts)
        torch.manual_seed(args.seed)
        start = time.monotonic()
        prompts = [render_chat(tokenizer, chat_messages(p.problem, shots=args.shots)) for p in problems]
        rollouts = sample_rollouts(
            engine, tokenizer, prompts, args.group_size, limits[-1], config.temperature, config.top_p
        )
        seconds = time.monotonic() - start
        for limit in limits:
            cut = [r.length > limit or (r.length == limit and r.truncated) for r in rollouts]
            texts = [tokenizer.decode(r.response_ids[:limit], skip_special_tokens=True) for r in rollouts]
            right = [
                bool(compute_score("probe", text, problems[r.group].answer)["acc"])
                for r, text in zip(rollouts, texts, strict=True)
            ]
            groups = [right[g * args.group_size : (g + 1) * args.group_size] for g in range(len(problems))]
            mixed = sum(0 < sum(group) < len(group) for group in groups)
            wrong = sum(not any(group) for group in groups)
            lengths = [min(r.length, limit) for r in rollouts]
            print(
                f"| {task} | {limit} | {100 * sum(cut) / len(cut):.0f} % | "
                f"{100 * sum(right) / len(right):.1f} % | "
                f"{100 * sum(extract_answer(t) is not None for t in texts) / len(texts):.0f} % | "
                f"{mixed} of {len(groups)} | {wrong} of {len(groups)} | {sum(lengths) / len(lengths):.0f} | "
                f"{seconds:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
