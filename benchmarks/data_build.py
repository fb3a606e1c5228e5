"""Benchmark of the data stage: `.venv/bin/python -m benchmarks.data_build [--requests 400 --latency 0.05]`.

1. Dedup (exact + MinHash near) and decontamination of the 17,917-row DAPO-Math-17K copy against every shipped
   evaluation set, on one core (target: under 30 s).
2. LLM rewriting throughput against a scripted OpenAI-compatible server with a fixed latency per request,
   versus the ideal requests / (latency / concurrency) (target: 90 %).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target says


def bench_dedup_decontam() -> None:
    from data_pipeline.decontam import ContaminationIndex, decontaminate
    from data_pipeline.dedup import exact_duplicates, near_duplicates
    from data_pipeline.sources import EVAL_SETS, load_eval_set, load_source
    from data_pipeline.text import repair_text

    start = time.perf_counter()
    rows, _ = load_source("dapo_math_17k")
    loaded = time.perf_counter()
    rows = [{**r, "problem": repair_text(r["problem"])} for r in rows]
    kept, _, exact = exact_duplicates(rows)
    kept, _, near = near_duplicates(kept)
    deduped = time.perf_counter()
    index = ContaminationIndex({name: load_eval_set(name) for name in EVAL_SETS})
    kept, removed, report = decontaminate(kept, index)
    done = time.perf_counter()
    work = done - loaded
    print(
        f"dedup+decontam of {len(rows)} rows: load {loaded - start:.1f} s (not counted), dedup "
        f"{deduped - loaded:.1f} s, decontam vs {len(index.items)} eval problems {done - deduped:.1f} s; "
        f"total {work:.1f} s (target < 30 s: {'met' if work < 30 else 'MISSED'})"
    )
    print(
        f"  identical repeats {exact['identical_text_repeats']} "
        f"({exact['identical_text_repeats_with_other_answer']} with another answer); exact clusters "
        f"{exact['clusters']}; near clusters {near['clusters']}; contaminated rows removed {len(removed)}"
    )
    for name, c in report["per_eval_set"].items():
        print(
            f"  {name}: {c['eval_problems_exact']} exact, {c['eval_problems_near']} near "
            f"({c['eval_problems_near_corpus']} corpus-wide)"
        )


def bench_llm(requests: int, latency: float, concurrency: int) -> None:
    import openai  # noqa: F401  (imported before the clock starts: the import takes about a second)

    from dapo_suite.testing.scripted_server import scripted_server_process
    from data_pipeline.llm import LLMRewriter

    reply = json.dumps(
        {"problem": "p", "answer": 3, "form": "m/n", "params": {"m": 1, "n": 2}, "target": "m+n"}
    )
    with (
        scripted_server_process(latency_s=latency, reply=reply) as base_url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        rewriter = LLMRewriter(base_url, "bench", Path(tmp) / "cache.jsonl", concurrency=concurrency)
        start = time.perf_counter()
        results = rewriter.rewrite_many([(f"Problem {i}", "\\frac{1}{2}") for i in range(requests)])
        elapsed = time.perf_counter() - start
    ideal = requests * latency / concurrency
    ok = sum(reason == "ok" for _, reason in results)
    print(
        f"llm rewriting: {requests} requests, {latency * 1000:.0f} ms each, concurrency {concurrency}: "
        f"{elapsed:.2f} s, {requests / elapsed:.1f} req/s; ideal {ideal:.2f} s, {requests / ideal:.1f} "
        "req/s; "
        f"ratio {ideal / elapsed:.1%} (target 90 %: {'met' if ideal / elapsed >= 0.9 else 'MISSED'}); {ok} ok"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument(
        "--latency", type=float, default=0.5, help="seconds per request on the scripted server"
    )
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    from dapo_suite.core.provenance import cpu_line

    print(cpu_line())
    bench_dedup_decontam()
    bench_llm(args.requests, args.latency, args.concurrency)


if __name__ == "__main__":
    main()
