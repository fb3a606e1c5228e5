"""The decode step's attention (`attend`, the fused kernels) against what one thread can read: how close the
bf16 and float32 kernels come to streaming the KV cache at memory speed, and how fast they run from cache.

    .venv/bin/python -m benchmarks.attention                          # 64 rows x 300 positions, bf16 and
    float32 .venv/bin/python -m benchmarks.attention --rows 8 --positions 600 --repeats 5

One decode step's attention over the embedded model's 30 layers: `--rows` queries (one per row), each
attending to its row's `--positions` cached positions (9 query heads on 3 key/value heads of 64 dims, as
SmolLM2-135M). Two placements of the cache:
  memory  every layer its own cache, as in decoding: the keys and values stream from memory
  cache   one layer's cache for every layer (with 4 rows it fits in L2): what the kernel computes at most
Each pass is timed alternately with a plain sum over 1 GiB (one thread's read bandwidth, the physical limit of
a cache read from memory), best of `--repeats`; printed: ms per pass, GB/s of keys and values read, and the
ratio to that read bandwidth. Python's garbage collector is paused while timing (it runs between kernel calls,
not in them). Run it pinned to one core (taskset -c 0) on a quiet machine.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64


def attention_pass(
    fused,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
    qkv: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """One decode step's `attend` over every layer's cache: each row's query at the slot after its
    positions."""
    rows = qkv.shape[0]
    slots, start = torch.full((rows,), caches[0][0].shape[2] - 1), torch.zeros(rows, dtype=torch.int64)
    empty, no_index = qkv.new_empty(0), torch.empty(0, dtype=torch.int64)
    for keys, values in caches:
        fused.attend(
            qkv,
            *rope,
            torch.arange(rows),
            slots,
            keys,
            values,
            start,
            empty,
            empty,
            no_index,
            no_index,
            HEADS,
            HEAD_DIM**-0.5,
        )


def read_seconds(source: torch.Tensor) -> float:
    start = time.perf_counter()
    source.sum()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--positions", type=int, default=300, help="cached positions each row attends to")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from dapo_suite.core.provenance import cpu_line
    from dapo_suite.inference.fused_step import kernels

    print(cpu_line())
    fused = kernels()
    if fused is None:
        raise SystemExit("the fused kernels could not be built here (a C++ compiler and ninja are needed)")
    torch.set_num_threads(1)
    source = torch.ones(2**28)  # 1 GiB of float32
    rope = (torch.randn(args.rows, HEAD_DIM), torch.randn(args.rows, HEAD_DIM))  # cos, sin
    print(
        f"{args.rows} rows x {args.positions} positions x {LAYERS} layers, {HEADS} query heads on {KV_HEADS} "
        f"key/value heads of {HEAD_DIM}; one thread; float32 kernels {fused.FLOAT32_VECTORS}, native bf16 "
        f"{fused.NATIVE_BF16}"
    )
    print("| dtype | cache | ms per pass | GB/s of keys and values | read GB/s | ratio to read |")
    print("|---|---|---|---|---|---|")
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        if dtype == torch.bfloat16 and not fused.NATIVE_BF16:
            print("| bfloat16 | - | no avx512_bf16 here: the bf16 attention kernel is not built | | | |")
            continue
        shape = (args.rows, KV_HEADS, args.positions, HEAD_DIM)
        qkv = torch.randn(args.rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype)
        placements = {
            "memory": [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in range(LAYERS)],
            "cache": [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype))] * LAYERS,
        }
        nbytes = LAYERS * 2 * args.rows * KV_HEADS * args.positions * HEAD_DIM * dtype.itemsize
        for name, caches in placements.items():
            attention_pass(fused, caches, qkv, rope)
            gc.collect()
            gc.disable()
            best, best_read = float("inf"), float("inf")
            for _ in range(args.repeats):  # the kernel and the read take turns: the host's speed moves
                best_read = min(best_read, read_seconds(source))
                begin = time.perf_counter()
                attention_pass(fused, caches, qkv, rope)
                best = min(best, time.perf_counter() - begin)
            gc.enable()
            rate, read = nbytes / best / 1e9, source.numel() * 4 / best_read / 1e9
            print(
                f"| {str(dtype).removeprefix('torch.')} | {name} | {best * 1e3:.1f} | {rate:.1f} | "
                f"{read:.1f} | {rate / read:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
