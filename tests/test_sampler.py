"""The lean decode path (dapo_suite/decoding.py) against transformers' own decode step."""

from __future__ import annotations

import pytest
import torch

PROMPTS = ["What is 2 + 3? Answer with a number.", "Say hi.", "Count from one to ten in words, then stop.",
           "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?"]


def _encoded(tokenizer):
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in PROMPTS]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def _sample(model, tokenizer, decoder, dtype=None, samples_per_prompt=3):
    from dapo_suite.sampling import sample_tokens

    encoded = _encoded(tokenizer)
    generator = torch.Generator().manual_seed(7)
    return sample_tokens(model, encoded["input_ids"], encoded["attention_mask"], 40, 1.0, 0.9,
                         {tokenizer.eos_token_id}, tokenizer.pad_token_id, samples_per_prompt=samples_per_prompt,
                         generator=generator, dtype=dtype, decoder=decoder)


def test_lean_decoder_samples_the_same_tokens_as_transformers_in_float32(embedded_model_dir):
    """Same seed, float32: the lean stepper (static cache, fused projections) draws exactly the tokens that
    transformers' step draws, with the same log-probs, through row dropping and shared prompt prefixes."""
    from dapo_suite.decoding import lean_supported
    from dapo_suite.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    assert lean_supported(model)
    reference, lean = _sample(model, tokenizer, "hf"), _sample(model, tokenizer, "auto")
    assert reference.stopped.any() and not reference.stopped.all()  # rows were dropped along the way
    assert torch.equal(lean.tokens, reference.tokens)
    assert torch.equal(lean.lengths, reference.lengths) and torch.equal(lean.stopped, reference.stopped)
    torch.testing.assert_close(lean.log_probs, reference.log_probs, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_lower_precision_sampling_reports_log_probs_near_the_trainers(embedded_model_dir):
    """bfloat16 sampling (dtype=...) returns the sampler's own log-probs: close to, but not equal to, float32's.
    This gap is the rollout-training mismatch that rollout correction weighs."""
    from dapo_suite.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    sampled = _sample(model, tokenizer, "auto", dtype=torch.bfloat16, samples_per_prompt=1)
    mask = torch.arange(sampled.tokens.shape[1]) < sampled.lengths[:, None]
    # Score the bf16 samples with the float32 transformers path (teacher-forced), as the trainer does.
    encoded = _encoded(tokenizer)
    ids = torch.cat([encoded["input_ids"], sampled.tokens], dim=1)
    attention = torch.cat([encoded["attention_mask"], mask.long()], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits.float()
    prompt_len = encoded["input_ids"].shape[1]
    trainer = torch.log_softmax(logits[:, prompt_len - 1 : -1], -1).gather(-1, sampled.tokens.unsqueeze(-1)).squeeze(-1)
    difference = (trainer - sampled.log_probs).abs()[mask]
    assert 0 < difference.max() < 1.0  # different numerics, same distribution
    assert difference.mean() < 0.05


def test_attention_merged_from_two_key_sets_equals_attention_over_both():
    """merge_attention(prompt part, own part) is softmax attention over the concatenated keys."""
    from dapo_suite.decoding import _attention_with_lse, merge_attention

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=generator) for _ in range(3))
    k2, v2 = (torch.randn(2, 3, 5, 8, generator=generator) for _ in range(2))
    whole = torch.nn.functional.scaled_dot_product_attention(q, torch.cat([k, k2], 2), torch.cat([v, v2], 2))
    first, first_lse = _attention_with_lse(q, k, v)[:2]
    second, second_lse = _attention_with_lse(q, k2, v2)[:2]
    torch.testing.assert_close(merge_attention(first, first_lse, second, second_lse), whole, atol=1e-6, rtol=1e-5)
