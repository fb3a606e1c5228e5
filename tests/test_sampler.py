"""The lean decode path (dapo_suite/decoding.py) against transformers' own decode step."""

from __future__ import annotations

import pytest
import torch

PROMPTS = ["What is 2 + 3? Answer with a number.", "Say hi.", "Count from one to ten in words, then stop.",
           "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?"]


def _encoded(tokenizer, prompts=PROMPTS):
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
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


def test_length_runs_are_the_cheapest_split_of_the_prompt_pass():
    # Against brute force over every split of the prompts sorted by length (a run is contiguous in that order).
    import itertools
    import random

    from dapo_suite.sampling import length_buckets

    rng = random.Random(0)
    for _ in range(40):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 8))]
        cost = rng.choice([0, 16, 64, 1000])
        ordered = sorted(lengths, reverse=True)
        splits = [(0, *cuts, len(ordered)) for n in range(len(ordered))
                  for cuts in itertools.combinations(range(1, len(ordered)), n)]
        cheapest = min(sum((b - a) * ordered[a] + cost for a, b in itertools.pairwise(split)) for split in splits)
        runs = length_buckets(lengths, cost)
        assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
        assert sum(len(run) * max(lengths[i] for i in run) + cost for run in runs) == cheapest


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[1:3]], ids=["several-runs", "one-run-shortest-first"])
def test_prompt_pass_in_length_runs_gives_the_single_pass_cache(embedded_model_dir, prompts):
    """The prompts' keys and values from one pass per run of similar length, placed back into one left-padded
    cache, equal one padded pass over all prompts at every real position and in the prompts' order (float32)."""
    from dapo_suite.models import load_model_and_tokenizer
    from dapo_suite.sampling import length_buckets, prefill

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    encoded = _encoded(tokenizer, prompts)
    ids, mask = encoded["input_ids"][:, :-1], encoded["attention_mask"][:, :-1]
    runs = length_buckets(mask.sum(-1).tolist())
    assert len(runs) > 1 if prompts is PROMPTS else runs == [[1, 0]]  # several runs; one, longest first
    runs = prefill(model, ids, mask, torch.float32)
    with torch.no_grad():
        single = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                       use_cache=True).past_key_values
    real = mask.bool()
    for ran, reference in zip(runs.layers, single.layers, strict=True):
        assert ran.keys.shape == reference.keys.shape
        for got, expected in ((ran.keys, reference.keys), (ran.values, reference.values)):
            torch.testing.assert_close(got.transpose(1, 2)[real], expected.transpose(1, 2)[real], atol=1e-4, rtol=0)


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


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_projection_in_bfloat16_equals_aten_linear_bit_for_bit(rows):
    """The oneDNN-packed bf16 projection the lean stepper uses gives exactly aten's bf16 `F.linear` values, with
    and without a bias; without native bf16 it is `F.linear` itself."""
    from dapo_suite.decoding import Projection, packs_bf16

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(960, 576, generator=generator).to(torch.bfloat16)
    bias = torch.randn(960, generator=generator).to(torch.bfloat16)
    x = torch.randn(rows, 576, generator=generator).to(torch.bfloat16)
    for b in (None, bias):
        projection = Projection(weight, b)
        assert projection.packed == packs_bf16(torch.bfloat16, x.device)
        assert torch.equal(projection(x), torch.nn.functional.linear(x, weight, b))
    assert not Projection(weight.float()).packed  # float32 stays on aten (MKL), as the equality tests require


def _attention_inputs(rows: int, length: int, dtype: torch.dtype, seed: int = 0):
    """q and slices of a preallocated (rows, H_kv, slots, D) cache, as the lean stepper passes them, with the
    first positions of row 0 masked like left padding."""
    generator = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, rows, 3, length + 7, 64, generator=generator).to(dtype)
    q = torch.randn(rows, 3, 3, 64, generator=generator).to(dtype)
    bias = torch.zeros(rows, 1, 1, length, dtype=dtype)
    bias[0, ..., :5] = float("-inf")
    return q, cache[0, ..., :length, :], cache[1, ..., :length, :], bias


def test_attention_written_for_the_compiler_equals_sdpa_in_float32():
    from dapo_suite.decoding import attention_with_lse, sdpa_with_lse

    q, keys, values, bias = _attention_inputs(5, 33, torch.float32)
    out, lse = attention_with_lse(q, keys, values, bias, 0.125)
    expected_out, expected_lse = sdpa_with_lse(q, keys, values, bias, 0.125)
    torch.testing.assert_close(out, expected_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, expected_lse, atol=1e-5, rtol=1e-5)


def test_compiled_decode_attention_matches_sdpa_in_bfloat16_for_any_batch_and_length():
    """The inductor-compiled attention the bf16 stepper uses (one compile, dynamic shapes) against SDPA."""
    from dapo_suite.decoding import fused_attention, sdpa_with_lse

    for rows, length in [(8, 40), (5, 71), (64, 130)]:
        q, keys, values, bias = _attention_inputs(rows, length, torch.bfloat16, seed=rows)
        out, lse = fused_attention()(q, keys, values, bias, 0.125)
        expected_out, expected_lse = sdpa_with_lse(q, keys, values, bias, 0.125)
        assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
        torch.testing.assert_close(out.float(), expected_out.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse, expected_lse, atol=2e-2, rtol=1e-2)


def test_bfloat16_sampling_without_a_cxx_compiler_falls_back_to_sdpa_and_says_so(tmp_path):
    """Where inductor cannot compile the decode attention (no C++ compiler), bf16 sampling still runs, on SDPA,
    with a warning that names the cause and the fix (a fresh inductor cache, so nothing compiled earlier is used)."""
    import os
    import subprocess
    import sys

    script = (
        "import warnings, torch\n"
        "from dapo_suite.models import load_model_and_tokenizer\n"
        "from dapo_suite.sampling import sample_tokens\n"
        "model, tok = load_model_and_tokenizer(None); model.eval()\n"
        "enc = tok(['Say hi.'] * 4, return_tensors='pt', padding=True)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    s = sample_tokens(model, enc['input_ids'], enc['attention_mask'], 6, 1.0, 0.9, {tok.eos_token_id},\n"
        "                      tok.pad_token_id, dtype=torch.bfloat16)\n"
        "print('ROWS', len(s.lengths), 'ALL GENERATED', bool((s.lengths >= 1).all()))\n"
        "print('WARNINGS', [str(w.message) for w in caught if 'compiled decode attention' in str(w.message)])\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ROWS 4 ALL GENERATED True" in result.stdout
    warning = result.stdout.split("WARNINGS", 1)[1]
    assert "InvalidCxxCompiler" in warning and "decoding with SDPA" in warning and "g++ or clang" in warning
