"""The DAPO update against the machine's matmul peak: achieved FLOP/s of `Actor.update` as a share of what
torch's matmuls reach at the model's own shapes, in the same run, on the same threads.

    .venv/bin/python -m benchmarks.update_flops                  # all cores, bf16 and float32, both shapes
    .venv/bin/python -m benchmarks.update_flops --threads 1      # one thread
    .venv/bin/python -m benchmarks.update_flops --shapes demo --dtypes bfloat16 --reps 1

Peak: the best rate of `torch.matmul` over the update's matmul shapes (tokens x hidden into the attention and
MLP projections, and into the LM head's 49k vocabulary; forward and the two backward products), bf16 and
float32, best of --reps after a warm-up. Update: one `DAPOTrainer.actor.update` (forward log-probs, the loss,
backward, one AdamW step: one epoch, where the effects study makes 2) on synthetic rollouts of a mini-batch of
the demo's (`tiny-cpu`: 2 prompts x 16 responses) or the effects study's (`effects-cpu`: 1 x 8) size, response
lengths up to 64 tokens; `bfloat16` is the trainer's bf16 autocast over float32 weights (the demo on a bf16
CPU), `float32` its plain float32.

Model FLOPs per mini-batch (the convention of MFU, Chowdhery et al. 2022, arXiv 2204.02311, appendix B): 6 x
the non-embedding parameters x every token the update must run, plus attention (6 x 2 x layers x hidden x each
such token's causal context), plus the LM head (6 x hidden x vocab) over the response tokens whose log-probs
the loss reads. A prompt its group shares counts once, as the trainer runs it (`Actor.shares_prompts`):
counting it per response would credit the update with work it never does, and the share could pass 1.
Target (issue #77): the update at >= 50 % of the peak in bf16 and float32.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from benchmarks.train_step import fill_old_log_probs, synthetic_groups
from dapo_suite.core.provenance import cpu_line

# name -> (preset scale, prompts in a mini-batch, responses per prompt, mean prompt tokens, response limit).
SHAPES = {
    "demo": ("tiny-cpu", 2, 16, 120, 64),
    "effects": ("effects-cpu", 1, 8, 90, 64),
}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def model_flops(config, tokens: int, response_tokens: int, context_tokens: float) -> float:
    """Forward + backward FLOPs of one update (arXiv 2204.02311, app. B): 6 N T + 12 L H C + 6 H V R, with N
    the non-embedding parameters, T the tokens run, C the sum of their causal contexts, R response tokens."""
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config.intermediate_size
    return (
        6 * layers * per_layer * tokens
        + 12 * layers * hidden * context_tokens
        + 6 * hidden * vocab * (response_tokens)
    )


def matmul_shapes(config, rows: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the update's products: the projections and the LM head, forward and both backward ones."""
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    outputs = (hidden, config.num_key_value_heads * head_dim, config.intermediate_size, config.vocab_size)
    shapes = []
    for n in outputs:
        shapes += [
            (rows, hidden, n),
            (rows, n, hidden),
            (hidden, rows, n),
        ]  # y = xW, dx = dy W^T, dW = x^T dy
    return shapes


def matmul_peak(shapes: list[tuple[int, int, int]], dtype: torch.dtype, reps: int) -> tuple[float, tuple]:
    """The best FLOP/s torch.matmul reaches over `shapes` (best of `reps` after a warm-up), and its shape."""
    best, best_shape = 0.0, shapes[0]
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        torch.matmul(a, b)
        for _ in range(reps):
            start = time.perf_counter()
            torch.matmul(a, b)
            rate = 2 * m * k * n / (time.perf_counter() - start)
            if rate > best:
                best, best_shape = rate, (m, k, n)
    return best, best_shape


def update_rate(shape: str, dtype: str, reps: int, seed: int) -> tuple[list[float], float, int]:
    """FLOP/s of `reps` timed updates (after a warm-up) at `shape` in `dtype`; the FLOPs and tokens of one."""
    from dapo_suite.train.config import resolve_config
    from dapo_suite.train.trainer import DAPOTrainer

    scale, prompts, group_size, prompt_len, response_len = SHAPES[shape]
    with tempfile.TemporaryDirectory() as tmp:
        # as `--set` settings: autocast_dtype None must turn off the scale preset's `auto` (bf16 where native)
        config = resolve_config(
            ["dapo", scale],
            settings={
                "out": tmp,
                "seed": seed,
                "train_batch_size": prompts,
                "mini_batch_size": prompts,
                "ppo_epochs": 1,  # one pass, one optimiser step: the FLOPs counted are the FLOPs run
                "dtype": "float32",
                "autocast_dtype": "bfloat16" if dtype == "bfloat16" else None,
                "device": "cpu",
            },
        )
        trainer = DAPOTrainer(config)
        ran = trainer.actor.config.autocast_dtype or "float32"
        assert ran == dtype, f"asked for a {dtype} update, the trainer runs {ran}"
        assert config.updates_per_step == 1, "an update here is one optimiser step"
        groups = synthetic_groups(
            prompts,
            group_size,
            prompt_len,
            response_len,
            trainer.model.config.vocab_size,
            trainer.tokenizer.eos_token_id,
            seed,
            prompt_jitter=8,
        )
        fill_old_log_probs(trainer, groups, config.micro_batch_size, 0.3, seed)
        flat = [r for group in groups for r in group]
        prompts_run = [group[:1] for group in groups] if trainer.actor.shares_prompts else [[r] for r in flat]
        prompt_lengths = [r.prompt_ids.numel() for rows in prompts_run for r in rows]
        tokens = sum(prompt_lengths) + sum(r.length for r in flat)
        # causal contexts: prompt position p sees p + 1 tokens, response position t sees P + t + 1
        context = sum(n * (n + 1) / 2 for n in prompt_lengths) + sum(
            r.length * r.prompt_ids.numel() + r.length * (r.length + 1) / 2 for r in flat
        )
        flops = model_flops(trainer.model.config, tokens, sum(r.length for r in flat), context)
        trainer.actor.update(groups)  # warm-up: kernels, allocator, optimizer state
        rates = []
        for _ in range(reps):
            start = time.perf_counter()
            trainer.actor.update(groups)
            rates.append(flops / (time.perf_counter() - start))
        return rates, flops, tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads [all cores]")
    parser.add_argument("--shapes", default="demo,effects", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--dtypes", default="bfloat16,float32", help=f"of {', '.join(DTYPES)}")
    parser.add_argument("--reps", type=int, default=3, help="timed repeats of each, after a warm-up")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shapes, dtypes = args.shapes.split(","), args.dtypes.split(",")
    for name, known in ((shapes, SHAPES), (dtypes, DTYPES)):
        if unknown := [item for item in name if item not in known]:
            parser.error(f"unknown {', '.join(unknown)}; valid: {', '.join(known)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoConfig

    from dapo_suite.inference.models import embedded_model_path

    model_config = AutoConfig.from_pretrained(embedded_model_path())
    print(f"[update-flops] torch {torch.__version__}, {torch.get_num_threads()} threads; {cpu_line()}")
    for dtype in dtypes:
        for shape in shapes:
            rates, flops, tokens = update_rate(shape, dtype, args.reps, args.seed)
            peak, at = matmul_peak(matmul_shapes(model_config, tokens), DTYPES[dtype], args.reps)
            median = statistics.median(rates)
            verdict = "met" if median >= 0.5 * peak else "missed"
            print(
                f"[{shape} {dtype}] update {median / 1e9:.1f} GFLOP/s (median of {len(rates)}; "
                f"{min(rates) / 1e9:.1f}-{max(rates) / 1e9:.1f}) over {flops / 1e9:.1f} GFLOP, "
                f"{tokens} tokens; matmul peak {peak / 1e9:.1f} GFLOP/s at {at[0]}x{at[1]}x{at[2]}: "
                f"update/peak {median / peak:.2f} (target >= 0.50: {verdict})"
            )


if __name__ == "__main__":
    main()
