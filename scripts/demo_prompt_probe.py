"""How the untrained embedded model answers the demo's training problems under each prompt rendering: the
share of samples with an `Answer:` line, the share right, and how many prompts give a mixed group (the only
groups dynamic sampling trains on, eq. 11 of arXiv 2503.14476). This is step 1 of every demo run, before any
update: the diagnosis in docs/results/demo/ starts here.

    python scripts/demo_prompt_probe.py --train-file runs/demo-seeds/data/train.parquet >
    docs/results/demo/probe.txt
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

import torch

from dapo_suite.core.prompts import FORMAT_EXAMPLES, chat_messages, format_prompt, render_chat
from dapo_suite.core.reward import compute_score, extract_answer
from dapo_suite.inference.models import load_model_and_tokenizer, resolve_precision
from dapo_suite.train.config import resolve_config
from dapo_suite.train.rollout import hf_engine, sample_rollouts
from dapo_suite.train.tasks import load_problems

# Arithmetic worked examples (numbers outside the task's ranges): the rendering tried first and not kept.
ARITHMETIC_EXAMPLES = (
    ("What is 23 + 14?", "23 + 14 = 37\nAnswer: 37"),
    ("What is 31 - 12?", "31 - 12 = 19\nAnswer: 19"),
)


def arithmetic_shots(problem: str, shots: int) -> list[dict[str, str]]:
    turns = []
    for example, response in ARITHMETIC_EXAMPLES[:shots]:
        turns += [
            {"role": "user", "content": format_prompt(example)},
            {"role": "assistant", "content": response},
        ]
    return turns + chat_messages(problem)


RENDERINGS = {
    "zero-shot (the paper's prompt)": lambda problem: chat_messages(problem),
    "1 format example (the default)": lambda problem: chat_messages(problem, shots=1),
    "2 format examples": lambda problem: chat_messages(problem, shots=2),
    "1 arithmetic example": lambda problem: arithmetic_shots(problem, 1),
    "2 arithmetic examples": lambda problem: arithmetic_shots(problem, 2),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train-file", required=True)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = resolve_config(["dapo"], {"out": "/dev/null"})
    config = replace(
        config, sampling_dtype=resolve_precision(config.sampling_dtype)
    )  # as the trainer runs it
    model, tokenizer = load_model_and_tokenizer(None, dtype="float32", device="cpu")
    engine = hf_engine(config, model, tokenizer)
    problems = random.Random(args.seed).sample(load_problems(args.train_file), args.prompts)
    print(
        f"{args.prompts} training problems x {config.group_size} samples, temperature {config.temperature}, "
        f"{config.max_response_length} tokens, sampling in {config.sampling_dtype or 'float32'}, "
        f"seed {args.seed}; examples shown: {[question for question, _ in FORMAT_EXAMPLES]}"
    )
    print(
        "| rendering | Answer: line | right | prompts with a mixed group | seconds |\n|---|---|---|---|---|"
    )
    for name, render in RENDERINGS.items():
        torch.manual_seed(args.seed)
        start = time.monotonic()
        prompts = [render_chat(tokenizer, render(problem.problem)) for problem in problems]
        rollouts = sample_rollouts(
            engine,
            tokenizer,
            prompts,
            config.group_size,
            config.max_response_length,
            config.temperature,
            config.top_p,
        )
        right = [compute_score("probe", r.text, problems[r.group].answer)["acc"] for r in rollouts]
        formatted = sum(extract_answer(r.text) is not None for r in rollouts)
        mixed = sum(
            0 < sum(right[g * config.group_size : (g + 1) * config.group_size]) < config.group_size
            for g in range(len(problems))
        )
        print(
            f"| {name} | {100 * formatted / len(rollouts):.1f} % | {100 * sum(right) / len(rollouts):.1f} % "
            f"| {mixed} of {len(problems)} | {time.monotonic() - start:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
