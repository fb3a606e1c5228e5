"""How close rollout sampling gets to what this machine allows, and how it compares with `model.generate`.

    .venv/bin/python -m benchmarks.sampler_bound                                   # batch 1, 16, 64 x 256
    tokens .venv/bin/python -m benchmarks.sampler_bound --batches 1,16 --max-tokens 64 --dtypes
    float32,bfloat16 .venv/bin/python -m benchmarks.sampler_bound --batches 64 --groups 1,8   # 8 prompts x 8
    samples, shared cache

In one run it measures the machine (STREAM-style copy bandwidth, matmul FLOP/s, on the threads the sampler
uses), derives a roofline bound in tokens/s for the responses actually produced (`bound_seconds`: per decode
step, weights + the KV cache of the rows still decoding against bandwidth, or FLOPs against FLOP/s, whichever
is slower; plus the prompt pass's FLOPs), then times `sample_tokens` (the lean
decoder) and a plain batched `model.generate` on the same GSM8K prompts. Tokens are counted only while a
response is unfinished (generate keeps computing rows that have stopped). It also reports the log-prob gap
between a lower sampling dtype and the float32 trainer. `--dtypes int8` samples from the weights quantized as
`rollout_quantization: int8` makes them (int8 per output channel, float32 activations and KV cache); its bound
counts one byte a weight; `--dtypes int4` (groups of 32 with a float16 scale each) counts 0.5625. Each
dtype's weights snapshot is made once before its timed calls, as a trainer's engine makes one per weight sync.
"""

from __future__ import annotations

import argparse
import time

import torch

# --dtypes name -> (activation and KV cache dtype, rollout_quantization of the weights)
SAMPLING_DTYPES = {
    "float32": (torch.float32, None),
    "bfloat16": (torch.bfloat16, None),
    "int8": (torch.float32, "int8"),
    "int4": (torch.float32, "int4"),
}


def best_seconds(run, repeats: int = 5) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def copy_bandwidth(megabytes: int = 512) -> float:
    """Bytes/s of a large tensor copy (read + write), like STREAM's copy kernel."""
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / best_seconds(lambda: target.copy_(source))


def read_bandwidth(megabytes: int = 1024) -> float:
    """Bytes/s of reading a large tensor once (its sum, which keeps up with a read from cache): how fast the
    threads can stream weights that no cache holds. One core reads slower than a copy's read + write counting
    suggests."""
    source = torch.ones(megabytes * 2**20 // 4)
    return source.numel() * 4 / best_seconds(lambda: source.sum())


def matmul_flops(dtype: torch.dtype, size: int = 2048) -> float:
    """FLOP/s of a square matmul: the faster of aten's product and oneDNN's linear on a weight reordered once.
    Either alone can understate the machine: aten's float32 product is MKL's, which on some CPUs runs far
    below oneDNN's, and a bound from it can put the sampler above 100 % (docs/results/sampler/history.md)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    seconds = best_seconds(lambda: a @ b, repeats=10)
    if torch.backends.mkldnn.is_available():
        from torch.utils import mkldnn

        onednn, x = mkldnn.to_mkldnn(torch.nn.Linear(size, size, bias=False).to(dtype), dtype), a.to_mkldnn()
        seconds = min(seconds, best_seconds(lambda: onednn(x), repeats=10))
    return 2 * size**3 / seconds


def bound_seconds(
    config,
    params: int,
    embed_params: int,
    lengths: torch.Tensor,
    prompt_tokens: torch.Tensor,
    group: int,
    dtype_bytes: float,
    bandwidth: float,
    flops: float,
    kv_bytes: int | None = None,
) -> float:
    """Roofline time for producing exactly these responses: the prompt pass (its FLOPs against FLOP/s) plus,
    for every decode step, the slower of its bytes against bandwidth (all weights once, plus the KV cache of
    the rows still decoding: each prompt once when its G samples share it, else once per row) and its FLOPs
    against FLOP/s (2 per weight per row, plus attention's QK^T and AV over the row's context).

    Only rows that are still decoding count: a response that has ended needs no more work, so a step with few
    rows left is bandwidth-bound on the weights alone. lengths: (rows,) generated tokens; prompt_tokens:
    (prompts,) real (unpadded) prompt tokens; row i belongs to prompt i // group. dtype_bytes: a weight's;
    kv_bytes: a cached key or value element's (default: a weight's)."""
    head_dim = config.hidden_size // config.num_attention_heads
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim  # keys + values
    attention_flops = (
        4 * config.num_hidden_layers * config.num_attention_heads * head_dim
    )  # per context position
    row_prompt = prompt_tokens.repeat_interleave(group).double()
    # the prompt pass keeps the logits of its last position only: no output projection for the rest
    seconds = (
        2 * ((params - embed_params) * float(prompt_tokens.sum()) + embed_params * len(prompt_tokens)) / flops
    )
    for step in range(int(lengths.max())):
        alive = lengths > step
        context = float((row_prompt[alive] + step).sum())
        if group > 1:  # the prompts with a live row, read once each, plus each live row's own tokens
            prompts_alive = alive.view(-1, group).any(-1)
            kv_read = float(prompt_tokens[prompts_alive].sum()) + int(alive.sum()) * step
        else:
            kv_read = context
        step_bytes = params * dtype_bytes + kv_read * kv_per_token * (kv_bytes or dtype_bytes)
        step_flops = 2 * params * int(alive.sum()) + attention_flops * context
        seconds += max(step_bytes / bandwidth, step_flops / flops)
    return seconds


def generated_tokens(rows: torch.Tensor, eos: set[int]) -> int:
    """Tokens up to and including each row's first end-of-sequence token."""
    total = 0
    for row in rows.tolist():
        total += next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
    return total


@torch.no_grad()
def logprob_gap(model, encoded, sampled) -> tuple[float, float]:
    """Max and mean |log p| gap between the sampler's log-probs and a float32 teacher-forced forward pass of
    the model (what the trainer recomputes as pi_old), over generated tokens."""
    mask = torch.arange(sampled.tokens.shape[1]) < sampled.lengths[:, None]
    ids = torch.cat([encoded["input_ids"], sampled.tokens], dim=1)
    attention = torch.cat([encoded["attention_mask"], mask.long()], dim=1)
    logits = (
        model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
            logits_to_keep=sampled.tokens.shape[1] + 1,
        )
        .logits[:, :-1]
        .float()
    )
    trainer = torch.log_softmax(logits, -1).gather(-1, sampled.tokens.unsqueeze(-1)).squeeze(-1)
    gap = (trainer - sampled.log_probs).abs()[mask]
    return gap.max().item(), gap.mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--dtypes", default="float32", help=f"sampling dtypes to time ({', '.join(SAMPLING_DTYPES)})"
    )
    parser.add_argument(
        "--groups",
        default="1",
        help="samples per prompt G (the rows of a batch are batch/G "
        "prompts x G samples; G > 1 decodes with the prompt's cache shared)",
    )
    parser.add_argument("--skip-generate", action="store_true", help="time only the sampler")
    args = parser.parse_args()

    from dapo_suite.core.provenance import cpu_line
    from dapo_suite.inference.engines import end_of_response_ids
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.inference.sampling import sample_tokens
    from dapo_suite.inference.weights import QUANTIZERS, StepperWeights
    from eval.data import load_problems
    from eval.prompts import format_prompt

    model, tokenizer = load_model_and_tokenizer(None)
    model.eval()
    config = model.config
    params = sum(
        p.numel() for p in model.parameters()
    )  # the tied embedding once: it is the output projection
    embed_params = model.model.embed_tokens.weight.numel()
    print(
        f"{cpu_line()}; {torch.get_num_threads()} threads; copy bandwidth measured before each row (on a "
        f"shared host it moves within an hour)"
    )
    batches = [int(b) for b in args.batches.split(",")]
    problems = load_problems("gsm8k", limit=max(batches + [8]))
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": format_prompt(p.problem)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for p in problems
    ]
    eos, pad = (
        end_of_response_ids(model, tokenizer),
        tokenizer.pad_token_id,
    )  # where the product's responses end
    # (dtype, label, tok/s, bound arguments, copy, matmul) per row, to re-derive at the run's best
    measured = []
    print(
        "| dtype | batch (prompts x G) | copy GB/s | sampler tok/s | bound tok/s | % of bound | generate "
        "tok/s | sampler / generate |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for dtype_name in args.dtypes.split(","):
        if dtype_name not in SAMPLING_DTYPES:
            parser.error(f"--dtypes {dtype_name}: not one of {', '.join(SAMPLING_DTYPES)}")
        dtype, quantization = SAMPLING_DTYPES[dtype_name]
        weights = StepperWeights(model, dtype, quantization)
        weight_bytes = QUANTIZERS[quantization].bytes_per_weight if quantization else dtype.itemsize
        # One short call first: it loads the fused kernels (built once per machine and source version, then
        # cached by torch.utils.cpp_extension), which every timed call below reuses, as a trainer's later
        # rollouts do.
        encoded = tokenizer(texts[:8], return_tensors="pt", padding=True, add_special_tokens=False)
        start = time.perf_counter()
        sample_tokens(
            model,
            encoded["input_ids"],
            encoded["attention_mask"],
            8,
            1.0,
            0.7,
            eos,
            pad,
            dtype=dtype,
            weights=weights,
        )
        print(f"<!-- {dtype_name} warm-up call (8 rows x 8 tokens): {time.perf_counter() - start:.1f} s -->")
        for batch, group in [(b, g) for b in batches for g in map(int, args.groups.split(",")) if b % g == 0]:
            encoded = tokenizer(
                texts[: batch // group], return_tensors="pt", padding=True, add_special_tokens=False
            )
            generator = torch.Generator().manual_seed(0)
            bandwidth, flops = copy_bandwidth(), matmul_flops(dtype)
            print(f"<!-- {dtype_name} matmul before this row: {flops / 1e9:.1f} GFLOP/s -->")
            start = time.perf_counter()
            sampled = sample_tokens(
                model,
                encoded["input_ids"],
                encoded["attention_mask"],
                args.max_tokens,
                1.0,
                0.7,
                eos,
                pad,
                samples_per_prompt=group,
                generator=generator,
                dtype=dtype,
                weights=weights,
            )
            seconds = time.perf_counter() - start
            tokens = int(sampled.lengths.sum())
            rate = tokens / seconds
            prompt_len = encoded["input_ids"].shape[1]
            prompt_tokens = encoded["attention_mask"].sum(-1)
            shape = (config, params, embed_params, sampled.lengths, prompt_tokens, group, weight_bytes)
            bound = tokens / bound_seconds(*shape, bandwidth, flops, kv_bytes=dtype.itemsize)
            measured.append(
                (dtype_name, f"{batch} ({batch // group} x {group})", rate, shape, bandwidth, flops, dtype)
            )
            generate_cell, ratio_cell = "-", "-"
            if not args.skip_generate:
                torch.manual_seed(0)
                start = time.perf_counter()
                with torch.inference_mode():
                    output = model.generate(
                        **encoded,
                        max_new_tokens=args.max_tokens,
                        do_sample=True,
                        top_p=0.7,
                        top_k=0,
                        temperature=1.0,
                        pad_token_id=pad,
                        eos_token_id=sorted(eos),
                        num_return_sequences=group,
                    )
                generate_rate = generated_tokens(output[:, prompt_len:], eos) / (time.perf_counter() - start)
                generate_cell, ratio_cell = f"{generate_rate:.1f}", f"{rate / generate_rate:.2f}x"
            print(
                f"| {dtype_name} | {batch} ({batch // group} x {group}) | {bandwidth / 1e9:.1f} | {rate:.1f} "
                f"| {bound:.1f} | {100 * rate / bound:.0f} % | {generate_cell} | {ratio_cell} |",
                flush=True,
            )
            if group == 1:
                max_gap, mean_gap = logprob_gap(model, encoded, sampled)
                print(
                    f"<!-- {dtype_name} sampler vs float32 trainer log-probs, batch {batch}: max "
                    f"{max_gap:.2e}, mean {mean_gap:.2e} -->",
                    flush=True,
                )
    # On a shared host the copy bandwidth and the matmul rate move within one run while the sampler's speed
    # barely does: the same rows against the best of each that the run measured, the machine's limits, the
    # stricter bound.
    best_bandwidth = max(row[4] for row in measured)
    best_flops = {name: max(row[5] for row in measured if row[0] == name) for name, *_ in measured}
    cells = []
    for name, label, rate, shape, _, _, dtype in measured:
        bound = int(shape[3].sum()) / bound_seconds(
            *shape, best_bandwidth, best_flops[name], kv_bytes=dtype.itemsize
        )
        cells.append(f"{name} {label}: {100 * rate / bound:.0f} %")
    limits = ", ".join(f"{name} {value / 1e9:.0f} GFLOP/s" for name, value in best_flops.items())
    print(
        f"at the run's best copy bandwidth ({best_bandwidth / 1e9:.1f} GB/s) and matmul rate ({limits}): "
        + "; ".join(cells)
    )


if __name__ == "__main__":
    main()
