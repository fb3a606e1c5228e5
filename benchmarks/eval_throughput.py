"""Throughput of the evaluation engines.

    .venv/bin/python -m benchmarks.eval_throughput            # both parts
    .venv/bin/python -m benchmarks.eval_throughput --part hf --prompts 16 --max-tokens 32

1. HF engine vs a plain `model.generate` loop (one prompt at a time) on the same GSM8K prompts, embedded
   model: tokens/s of each and the ratio (target: engine >= 1.5x the loop).
2. OpenAI-endpoint engine vs a scripted server that answers every request after a fixed latency: requests/s
   against the ideal concurrency / latency (target: >= 90 % of ideal).
"""

from __future__ import annotations

import argparse
import time


def hf_part(prompts: int, max_tokens: int, batch_size: int) -> float:
    import torch

    from dapo_suite.core.prompts import render_chat
    from dapo_suite.inference.engines import HFEngine, Request, Sampling, end_of_response_ids
    from eval.data import load_problems
    from eval.prompts import format_prompt

    engine = HFEngine.load(batch_size=batch_size)
    model, tokenizer = engine.model, engine.tokenizer
    problems = load_problems("gsm8k", limit=prompts)
    requests = [Request(p.id, 0, format_prompt(p.problem), i) for i, p in enumerate(problems)]
    sampling = Sampling(temperature=1.0, top_p=0.7, max_tokens=max_tokens)

    # the plain loop: one prompt per model.generate call, same sampling settings
    torch.manual_seed(0)
    loop_tokens, start = 0, time.perf_counter()
    for request in requests:
        inputs = tokenizer(
            render_chat(tokenizer, request.prompt), return_tensors="pt", add_special_tokens=False
        )
        with torch.inference_mode():  # ending where the engine's responses end
            output = model.generate(
                **inputs,
                max_new_tokens=max_tokens,
                do_sample=True,
                temperature=1.0,
                top_p=0.7,
                top_k=0,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=sorted(end_of_response_ids(model, tokenizer)),
            )
        loop_tokens += output.shape[1] - inputs["input_ids"].shape[1]
    loop_s = time.perf_counter() - start

    done = []
    start = time.perf_counter()
    engine.generate(requests, sampling, done.append)
    engine_s = time.perf_counter() - start
    engine_tokens = sum(c.num_tokens for c in done)
    loop_rate, engine_rate = loop_tokens / loop_s, engine_tokens / engine_s
    print(f"[hf] {prompts} prompts x {max_tokens} max new tokens, {torch.get_num_threads()} threads")
    print(
        f"[hf] plain model.generate loop: {loop_tokens} tokens in {loop_s:.1f} s = {loop_rate:.1f} tokens/s"
    )
    print(
        f"[hf] HF engine (batch {batch_size}): {engine_tokens} tokens in {engine_s:.1f} s = "
        f"{engine_rate:.1f} tokens/s"
    )
    ratio = engine_rate / loop_rate
    print(f"[hf] ratio engine / loop = {ratio:.2f}x (target >= 1.5x): {'PASS' if ratio >= 1.5 else 'FAIL'}")
    return ratio


def endpoint_part(requests_total: int, concurrency: int, latency: float) -> float:
    from dapo_suite.inference.engines import Request, Sampling
    from dapo_suite.testing.scripted_server import scripted_server_process
    from eval.engines import OpenAIEngine

    with scripted_server_process(latency_s=latency) as url:
        engine = OpenAIEngine(url, concurrency=concurrency, max_retries=0)
        requests = [Request(f"p{i // 8}", i % 8, "question", i) for i in range(requests_total)]
        engine.generate(
            requests[:concurrency], Sampling(1.0, 0.7, 16), lambda c: None
        )  # warm-up (first-call costs)
        done = []
        start = time.perf_counter()
        engine.generate(requests, Sampling(1.0, 0.7, 16), done.append)
        wall = time.perf_counter() - start
    rate, ideal = len(done) / wall, concurrency / latency
    print(
        f"[endpoint] {requests_total} requests, concurrency {concurrency}, server latency {latency} s "
        "(scripted server in its own process)"
    )
    print(f"[endpoint] {rate:.1f} requests/s vs ideal {ideal:.1f} requests/s (concurrency / latency)")
    share = rate / ideal
    print(f"[endpoint] {100 * share:.1f} % of ideal (target >= 90 %): {'PASS' if share >= 0.9 else 'FAIL'}")
    return share


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=["all", "hf", "endpoint"], default="all")
    parser.add_argument("--prompts", type=int, default=16, help="hf: GSM8K prompts")
    parser.add_argument("--max-tokens", type=int, default=32, help="hf: new tokens per prompt")
    parser.add_argument("--batch-size", type=int, default=16, help="hf: engine batch size")
    parser.add_argument(
        "--requests",
        type=int,
        default=1920,
        help="endpoint: requests sent (30 waves at the defaults, so connection set-up is amortised)",
    )
    parser.add_argument("--concurrency", type=int, default=64, help="endpoint: requests in flight")
    parser.add_argument("--latency", type=float, default=0.5, help="endpoint: server latency in seconds")
    args = parser.parse_args()
    from dapo_suite.core.provenance import cpu_line

    print(cpu_line())
    if args.part in ("all", "endpoint"):
        endpoint_part(args.requests, args.concurrency, args.latency)
    if args.part in ("all", "hf"):
        hf_part(args.prompts, args.max_tokens, args.batch_size)


if __name__ == "__main__":
    main()
