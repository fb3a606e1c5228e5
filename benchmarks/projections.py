"""The bf16 decode step's projections: the fused kernels' `linear` against oneDNN's and aten's, at the row
counts the sampler runs, with the weights read from memory as a decode step reads them.

    .venv/bin/python -m benchmarks.projections                     # rows 1, 4, 8, 16, 30, 64, 2048
    .venv/bin/python -m benchmarks.projections --rows 1,64 --repeats 20

The embedded model's projections of one step (per layer q/k/v, o, gate/up and down; then the output
projection), each layer with its own weights, so the 269 MB of bf16 weights stream from memory as in decoding
(one layer's weights, reused, would sit in cache and flatter every kernel). One pass over all of them is timed
for each implementation, the implementations taking turns, the best of `--repeats` each:
  stepper  what the lean stepper runs (`weights.Projection`): the fused `linear`, which on a CPU with AMX runs
           TILE_MIN_ROWS to 64 rows on the tile unit over the packed weight, and hands ONEDNN_MIN_ROWS rows or
           more to oneDNN on the weight in its blocked layout, reordered once
  vectors  the fused `linear`'s bf16 pair products on the vector units at every row count
  (`linear_on_vectors`) tiles    its AMX tile kernel at every row count (`linear_on_tiles`; a CPU with AMX
  only) onednn   oneDNN's linear on weights reordered once into its blocked layout (torch.ops.mkldnn), as the
  stepper
           keeps them (the layout picked for 64 rows)
  aten     torch.nn.functional.linear on the plain bf16 weights (oneDNN reorders them on every call)
Each row prints ms per pass and % of the roofline measured in the same run: the slower of the weights against
the copy bandwidth and the FLOPs against the square bf16 matmul's rate (2048 rows is the prompt pass's chunk).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.sampler_bound import copy_bandwidth, matmul_flops


def step_shapes(config) -> list[tuple[int, int]]:
    """(outputs, inputs) of every projection of one decode step, q/k/v and gate/up fused as the stepper fuses
    them."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    hidden, inner = config.hidden_size, config.intermediate_size
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    layer = [
        (qkv, hidden),
        (hidden, config.num_attention_heads * head_dim),
        (2 * inner, hidden),
        (hidden, inner),
    ]
    return layer * config.num_hidden_layers + [(config.vocab_size, hidden)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", default="1,4,8,16,30,64,2048", help="rows of x per projection (comma-separated)"
    )
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()

    from dapo_suite.core.provenance import cpu_line
    from dapo_suite.inference.fused_step import kernels
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.inference.weights import Projection

    print(cpu_line())
    fused = kernels()
    if fused is None or not fused.NATIVE_BF16:
        sys.exit("the fused kernels need a C++ compiler and a CPU with avx512_bf16; this one has neither")
    config = load_model_and_tokenizer(None)[0].config
    shapes = step_shapes(config)
    generator = torch.Generator().manual_seed(0)
    weights = [
        (torch.randn(shape, generator=generator) / shape[1] ** 0.5).to(torch.bfloat16) for shape in shapes
    ]
    weight_bytes = sum(w.numel() for w in weights) * 2
    flops_per_row = 2 * sum(w.numel() for w in weights)
    no_bias = torch.empty(
        0, dtype=torch.bfloat16
    )  # made once: a slice per call would be timed with the kernels
    kinds = {
        "stepper": ([Projection(w, kernels=fused) for w in weights], lambda x, projection: projection(x)),
        "vectors": (
            [fused.pack_weight(w) for w in weights],
            lambda x, w: fused.linear_on_vectors(x, w, no_bias),
        ),
    }
    if fused.TILE_MIN_ROWS:
        kinds["tiles"] = (kinds["vectors"][0], lambda x, w: fused.linear_on_tiles(x, w, no_bias))
    kinds["onednn"] = (
        [torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights],
        lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
    )
    kinds["aten"] = (weights, F.linear)
    others = [name for name in kinds if name != "stepper"]
    print(
        f"{len(shapes)} projections per step, {weight_bytes / 1e6:.0f} MB of bf16 weights, "
        f"{torch.get_num_threads()} threads; in the stepper the tile unit from {fused.TILE_MIN_ROWS or 'no'} "
        f"rows, oneDNN from {fused.ONEDNN_MIN_ROWS or 'no'} rows"
    )
    print(
        "| rows | copy GB/s | matmul GFLOP/s | roofline ms | "
        + " | ".join(f"{name} ms" for name in kinds)
        + " | stepper % of roofline | "
        + " | ".join(f"stepper over {name}" for name in others)
        + " |"
    )
    print("|---" * (6 + 2 * len(others)) + "|")
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {
            width: torch.randn(rows, width, generator=generator).to(torch.bfloat16) for _, width in shapes
        }
        bandwidth, flops = copy_bandwidth(), matmul_flops(torch.bfloat16)
        roofline = max(weight_bytes / bandwidth, rows * flops_per_row / flops)

        def one_step(packed, apply, inputs=inputs) -> None:
            for (_, width), w in zip(shapes, packed, strict=True):
                apply(inputs[width], w)

        # the kinds take turns, best of `--repeats` each: the host's speed moves within a row
        seconds = dict.fromkeys(kinds, float("inf"))
        for repeat in range(args.repeats + 1):
            for name, (packed, apply) in kinds.items():
                start = time.perf_counter()
                one_step(packed, apply)
                if repeat:  # the first turn warms up
                    seconds[name] = min(seconds[name], time.perf_counter() - start)
        print(
            f"| {rows} | {bandwidth / 1e9:.1f} | {flops / 1e9:.0f} | {roofline * 1e3:.2f} | "
            + " | ".join(f"{seconds[name] * 1e3:.2f}" for name in kinds)
            + f" | {100 * roofline / seconds['stepper']:.0f} % | "
            + " | ".join(f"{seconds[name] / seconds['stepper']:.2f}x" for name in others)
            + " |",
            flush=True,
        )


if __name__ == "__main__":
    main()
