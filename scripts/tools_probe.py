"""The tool study's probe (docs/results/tools/probe.txt): the untrained embedded model on each part of the
`word-problems-tool` task, text prompt against tool prompt, on training problems only (none held out by any of
the study's seeds), at the training sampling settings. It chose the task's mix; it reads no held-out problem.

    .venv/bin/python scripts/tools_probe.py --problems 24 --samples 8 --top-p 1.0 0.7 >
    docs/results/tools/probe.txt
"""

from __future__ import annotations

import argparse
import time

import torch

from dapo_suite.core.prompts import chat_messages, render_chat
from dapo_suite.core.provenance import provenance
from dapo_suite.core.reward import compute_score
from dapo_suite.core.sandbox import Sandbox
from dapo_suite.inference.engines import HFEngine, Request, Sampling
from dapo_suite.inference.models import load_model_and_tokenizer, resolve_precision
from dapo_suite.inference.tool_loop import ToolEngine, ToolSettings
from dapo_suite.train.config import resolve_config
from dapo_suite.train.tasks import TOOL_TASK_PARTS, builtin_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=40, help="training problems per part")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument(
        "--seeds", type=int, default=5, help="the study's seeds whose held-out problems are left out"
    )
    parser.add_argument(
        "--top-p",
        type=float,
        nargs="+",
        default=None,
        help="rollout top_p values to probe (default: the preset's)",
    )
    args = parser.parse_args()
    config = resolve_config(["tools-cpu"])
    heldout = {
        p.problem
        for seed in range(args.seeds)
        for p in builtin_task(config.task, config.heldout_size, seed)[1]
    }
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(None, dtype="float32", device="cpu")
    inner = HFEngine(model, tokenizer, 128, resolve_precision("auto", "cpu"), progress=False)
    print(
        f"# {provenance()['machine']}; {args.problems} training problems a part, {args.samples} samples, "
        f"T {config.temperature}, {config.max_response_length} tokens, {config.prompt_shots} shot"
    )
    print("top_p  part     arm    right    no-answer  calls/resp  code-failed  seconds")
    with Sandbox() as sandbox:
        engine = ToolEngine(inner, sandbox, ToolSettings(config.max_assistant_turns))
        for top_p, (part, make) in (
            (p, part) for p in args.top_p or [config.top_p] for part in TOOL_TASK_PARTS.items()
        ):
            sampling = Sampling(config.temperature, top_p, config.max_response_length, chat_template=False)
            problems = [p for p in make() if p.problem not in heldout][: args.problems]
            for arm, tools in (("text", False), ("tool", True)):
                requests = [
                    Request(
                        str(i),
                        j,
                        render_chat(
                            tokenizer, chat_messages(p.problem, shots=config.prompt_shots, tools=tools)
                        ),
                    )
                    for i, p in enumerate(problems)
                    for j in range(args.samples)
                ]
                completions, start = [], time.monotonic()
                (engine if tools else inner).generate(requests, sampling, completions.append)
                scores = [
                    compute_score("probe", c.graded_text, problems[int(c.problem_id)].answer)
                    for c in completions
                ]
                calls = [call for c in completions for call in c.tool_calls]
                print(
                    f"{top_p:<5}  {part:8} {arm:6} {sum(s['acc'] for s in scores) / len(scores):6.1%}   "
                    f"{sum(s['pred'] is None for s in scores) / len(scores):8.1%}  "
                    f"{len(calls) / len(completions):9.2f}  "
                    f"{sum(c.outcome != 'ok' for c in calls) / max(len(calls), 1):10.1%}  "
                    f"{time.monotonic() - start:7.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
