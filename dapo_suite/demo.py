"""`dapo-suite demo`: one DAPO step on the embedded model, phase by phase, on a CPU in about a minute.

Rollout (G samples per prompt) -> rule-based reward -> group advantages -> dynamic-sampling filter ->
clipped token-level loss -> one AdamW update, then the same batch's ratio statistics after the update.
"""

from __future__ import annotations

import random
import time

import torch

from dapo_suite.algorithm import group_advantages, mixed_groups, policy_loss, token_log_probs
from dapo_suite.models import load_model_and_tokenizer
from dapo_suite.prompts import chat_messages
from dapo_suite.reward import compute_score


def arithmetic_problems(count: int, seed: int) -> list[tuple[str, str]]:
    """Two-term additions: the embedded model solves some but not all, so groups have mixed outcomes."""
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        problems.append((f"What is {a} + {b}?", str(a + b)))
    return problems


def sequence_log_probs(model, sequences: torch.Tensor, attention: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """log pi(o_t | q, o_<t) for the response part of left-padded prompt+response rows: (B, T_response)."""
    logits = model(input_ids=sequences, attention_mask=attention).logits[:, prompt_len - 1 : -1]
    return token_log_probs(logits.float(), sequences[:, prompt_len:])


def run_demo(samples: int = 4, problems: int = 2, max_new_tokens: int = 160, seed: int = 0) -> None:
    torch.manual_seed(seed)
    print("loading the embedded model (SmolLM2-135M-Instruct; the first run converts it, ~20 s) ...")
    model, tokenizer = load_model_and_tokenizer()
    batch = arithmetic_problems(problems, seed)

    # Rollout: G samples per prompt, temperature 1.0 as in DAPO training.
    prompts = [tokenizer.apply_chat_template(chat_messages(q), tokenize=False, add_generation_prompt=True)
               for q, _ in batch for _ in range(samples)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    start = time.monotonic()
    with torch.no_grad():
        sequences = model.generate(**encoded, do_sample=True, temperature=1.0, top_p=1.0,
                                   max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    prompt_len = encoded["input_ids"].shape[1]
    responses = sequences[:, prompt_len:]
    response_mask = torch.cumsum(responses == tokenizer.eos_token_id, dim=1).le(1).float()  # through the first eos
    generated = int(response_mask.sum())
    print(f"rollout: {len(prompts)} responses, {generated} tokens in {time.monotonic() - start:.1f} s")

    # Reward: +1 / -1 from the last `Answer:` line.
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    truths = [truth for _, truth in batch for _ in range(samples)]
    results = [compute_score("demo", text, truth) for text, truth in zip(texts, truths, strict=True)]
    scores = torch.tensor([r["score"] for r in results])
    acc = torch.tensor([r["acc"] for r in results])
    group_ids = [i // samples for i in range(len(prompts))]
    for group, (question, truth) in enumerate(batch):
        preds = [results[i]["pred"] for i in range(len(prompts)) if group_ids[i] == group]
        print(f"  {question} (truth {truth}): extracted answers {preds}")

    # Advantages and the dynamic-sampling filter (groups with 0 < accuracy < 1).
    advantages = group_advantages(scores, group_ids)
    keep = mixed_groups(acc, group_ids)
    print(f"reward: mean {scores.mean():+.2f}; advantages {[round(a, 2) for a in advantages.tolist()]}")
    print(f"dynamic sampling keeps {int(keep.sum())}/{len(keep)} responses (groups with mixed outcomes)")

    # Loss and one update. With every group uniform the advantages are all zero: the step changes nothing,
    # which is exactly why DAPO resamples until the batch holds mixed groups.
    attention = torch.cat([encoded["attention_mask"], response_mask.long()], dim=1)
    with torch.no_grad():
        old_log_prob = sequence_log_probs(model, sequences, attention, prompt_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.1)
    log_prob = sequence_log_probs(model, sequences, attention, prompt_len)
    loss, metrics = policy_loss(log_prob, old_log_prob, advantages, response_mask, clip_low=0.2, clip_high=0.28)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    print(f"loss {loss.item():+.4f} (token-mean over {generated} tokens), grad norm {grad_norm:.3f}")
    with torch.no_grad():
        new_log_prob = sequence_log_probs(model, sequences, attention, prompt_len)
    _, after = policy_loss(new_log_prob, old_log_prob, advantages, response_mask)
    print(f"after the update: ratio in [{after['actor/ratio_min']:.4f}, {after['actor/ratio_max']:.4f}], "
          f"approx KL {after['actor/ppo_kl']:.2e}")
    print("\nnext: `dapo-suite --help` for the stages (data, train, eval, serve)")
