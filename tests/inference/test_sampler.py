"""The lean decode path (dapo_suite/inference/decoding.py, its weights, prefill and attention) against
transformers' own decode step."""

from __future__ import annotations

import pytest
import torch

PROMPTS = [
    "What is 2 + 3? Answer with a number.",
    "Say hi.",
    "Count from one to ten in words, then stop.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
]


def _encoded(tokenizer, prompts=PROMPTS):
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def _sample(model, tokenizer, decoder, dtype=None, samples_per_prompt=3, weights=None):
    from dapo_suite.inference.sampling import sample_tokens

    encoded = _encoded(tokenizer)
    generator = torch.Generator().manual_seed(7)
    return sample_tokens(
        model,
        encoded["input_ids"],
        encoded["attention_mask"],
        40,
        1.0,
        0.9,
        {tokenizer.eos_token_id},
        tokenizer.pad_token_id,
        samples_per_prompt=samples_per_prompt,
        generator=generator,
        dtype=dtype,
        decoder=decoder,
        weights=weights,
    )


@pytest.mark.parametrize("path", [pytest.param("fused kernels", marks=pytest.mark.kernels), "torch ops"])
def test_lean_decoder_samples_the_same_tokens_as_transformers_in_float32(
    embedded_model_dir, monkeypatch, path
):
    """Same seed, float32: the lean stepper (static cache, fused projections), on the fused float32 kernels
    and on torch's ops, draws exactly the tokens that transformers' step draws, with the same log-probs to
    1e-4, through row dropping and shared prompt prefixes."""
    import dapo_suite.inference.decoding as decoding
    import dapo_suite.inference.weights as weights
    from dapo_suite.inference.models import load_model_and_tokenizer

    if path == "fused kernels":
        _fused()
    else:
        monkeypatch.setattr(weights, "kernels", lambda: None)
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    assert decoding.lean_supported(model)
    encoded = _encoded(tokenizer)
    stepper = decoding.LeanStepper(model, encoded["input_ids"], encoded["attention_mask"], 4, torch.float32)
    assert (stepper.kernels is not None) == (path == "fused kernels")
    reference, lean = _sample(model, tokenizer, "hf"), _sample(model, tokenizer, "auto")
    assert reference.stopped.any() and not reference.stopped.all()  # rows were dropped along the way
    assert torch.equal(lean.tokens, reference.tokens)
    assert torch.equal(lean.lengths, reference.lengths) and torch.equal(lean.stopped, reference.stopped)
    torch.testing.assert_close(lean.log_probs, reference.log_probs, atol=1e-4, rtol=0)


@pytest.mark.kernels
def test_an_engine_samples_from_one_weight_snapshot_until_its_weights_are_synced(embedded_model_dir):
    """`HFEngine` casts and packs the policy's weights once (`StepperWeights`) and samples every batch of
    every `generate` from that snapshot, with the same tokens as a stepper that packs its own; after an
    in-place update (as an optimizer step makes) it samples the old weights until `sync_weights`, then the new
    ones."""
    from dapo_suite.inference.engines import HFEngine, Request, Sampling
    from dapo_suite.inference.models import load_model_and_tokenizer

    _fused()
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    requests = [
        Request(f"p{i}", j, prompt, seed=10 * i + j) for i, prompt in enumerate(PROMPTS) for j in range(2)
    ]

    def sample(engine) -> list[tuple[str, int, list[int]]]:
        done = []
        engine.generate(requests, Sampling(1.0, 0.9, 24), done.append)
        return sorted((c.problem_id, c.sample_index, c.token_ids.tolist()) for c in done)

    engine = HFEngine(model, tokenizer, batch_size=2, progress=False)  # 4 batches per generate
    first = sample(engine)
    snapshot = engine._weights
    assert snapshot is not None and snapshot.kernels is not None
    assert sample(engine) == first and engine._weights is snapshot
    engine._stepper_weights = lambda: None  # each batch's stepper packs its own: the same tokens
    assert sample(engine) == first
    del engine._stepper_weights

    with torch.no_grad():
        model.model.norm.weight.mul_(0.25)  # flattens every next-token distribution: other tokens
    assert sample(engine) == first  # not synced: the snapshot's weights
    engine.sync_weights()
    updated = sample(engine)
    assert updated != first and engine._weights is not snapshot
    assert updated == sample(HFEngine(model, tokenizer, batch_size=2, progress=False))


def test_length_runs_are_the_cheapest_split_of_the_prompt_pass():
    # Against brute force over every split of the prompts sorted by length (a run is contiguous in that
    # order).
    import itertools
    import random

    from dapo_suite.inference.prefill import length_buckets

    rng = random.Random(0)
    for _ in range(40):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 8))]
        cost = rng.choice([0, 16, 64, 1000])
        ordered = sorted(lengths, reverse=True)
        splits = [
            (0, *cuts, len(ordered))
            for n in range(len(ordered))
            for cuts in itertools.combinations(range(1, len(ordered)), n)
        ]
        cheapest = min(
            sum((b - a) * ordered[a] + cost for a, b in itertools.pairwise(split)) for split in splits
        )
        runs = length_buckets(lengths, cost)
        assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
        assert sum(len(run) * max(lengths[i] for i in run) + cost for run in runs) == cheapest


@pytest.mark.kernels
@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[1:3]], ids=["several-runs", "one-run-shortest-first"])
def test_prompt_pass_in_length_runs_gives_the_single_pass_cache(embedded_model_dir, prompts):
    """The prompts' keys and values from one pass per run of similar length, placed back into one left-padded
    cache, equal one padded pass over all prompts at every real position and in the prompts' order
    (float32)."""
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.inference.prefill import length_buckets, prefill

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    encoded = _encoded(tokenizer, prompts)
    ids, mask = encoded["input_ids"][:, :-1], encoded["attention_mask"][:, :-1]
    runs = length_buckets(mask.sum(-1).tolist())
    assert len(runs) > 1 if prompts is PROMPTS else runs == [[1, 0]]  # several runs; one, longest first
    runs = prefill(model, ids, mask, torch.float32)
    with torch.no_grad():
        single = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
        ).past_key_values
    real = mask.bool()
    for ran, reference in zip(runs.layers, single.layers, strict=True):
        assert ran.keys.shape == reference.keys.shape
        for got, expected in ((ran.keys, reference.keys), (ran.values, reference.values)):
            torch.testing.assert_close(
                got.transpose(1, 2)[real], expected.transpose(1, 2)[real], atol=1e-4, rtol=0
            )


@pytest.mark.kernels
@pytest.mark.slow
def test_lower_precision_sampling_reports_log_probs_near_the_trainers(embedded_model_dir):
    """bfloat16 sampling (dtype=...) returns the sampler's own log-probs: close to, but not equal to,
    float32's. This gap is the rollout-training mismatch that rollout correction weighs."""
    from dapo_suite.inference.models import load_model_and_tokenizer

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
    trainer = (
        torch.log_softmax(logits[:, prompt_len - 1 : -1], -1)
        .gather(-1, sampled.tokens.unsqueeze(-1))
        .squeeze(-1)
    )
    difference = (trainer - sampled.log_probs).abs()[mask]
    assert 0 < difference.max() < 1.0  # different numerics, same distribution
    assert difference.mean() < 0.05


def test_attention_merged_from_two_key_sets_equals_attention_over_both():
    """merge_attention(prompt part, own part) is softmax attention over the concatenated keys."""
    from dapo_suite.inference.attention import _attention_with_lse, merge_attention

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=generator) for _ in range(3))
    k2, v2 = (torch.randn(2, 3, 5, 8, generator=generator) for _ in range(2))
    whole = torch.nn.functional.scaled_dot_product_attention(q, torch.cat([k, k2], 2), torch.cat([v, v2], 2))
    first, first_lse = _attention_with_lse(q, k, v)[:2]
    second, second_lse = _attention_with_lse(q, k2, v2)[:2]
    torch.testing.assert_close(
        merge_attention(first, first_lse, second, second_lse), whole, atol=1e-6, rtol=1e-5
    )


def test_attention_by_ops_equals_the_cpu_kernel_and_gives_a_masked_row_no_weight():
    """Off a CPU the sampler attends by torch's ops (the flash kernel with a log-sum-exp is CPU-only): the
    same output and log-sum-exp as that kernel under a padding bias, and a row with every key masked merges to
    the other key set alone."""
    from dapo_suite.inference.attention import _attention_with_lse, attention_with_lse_by_ops, merge_attention

    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 4, 16, generator=generator) for _ in range(3))
    bias = torch.zeros(3, 1, 1, 4)
    bias[0, ..., :2] = float("-inf")  # left padding of the first row
    out, lse = attention_with_lse_by_ops(q, k, v, bias, 0.25)
    expected, expected_lse = _attention_with_lse(q, k, v, attn_mask=bias, scale=0.25)[:2]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, expected_lse, atol=1e-5, rtol=1e-5)
    masked = torch.full((3, 1, 1, 4), float("-inf"))
    none, none_lse = attention_with_lse_by_ops(q, k, v, masked, 0.25)
    assert not none.any() and torch.isneginf(none_lse).all()
    torch.testing.assert_close(merge_attention(none, none_lse, out, lse), out)


@pytest.mark.kernels
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 30, 64, 130])
def test_linear_equals_the_float32_product_within_bf16_rounding(rows):
    """The fused `linear` (weights packed in blocks of 48 outputs, tiles of 8 rows, bf16 pair products summed
    in float32; on an AMX CPU, TILE_MIN_ROWS-64 rows on the tile unit over the same packed weight, and from
    ONEDNN_MIN_ROWS rows oneDNN's matmul on the weight in its blocked layout, bit for bit aten's `F.linear`)
    against the float32 product, with and without a bias, at the decoder's widths and at widths that end in a
    block of 32 or 16 outputs; row counts across the tile edges. Weights it cannot pack (outputs % 16, inputs
    % 2) stay on aten's `F.linear`, bit for bit."""
    from dapo_suite.inference.weights import Projection

    fused = _native_bf16()
    generator = torch.Generator().manual_seed(rows)
    for out, width, with_bias in ((960, 576, True), (576, 1536, False), (80, 64, True), (64, 32, False)):
        weight = torch.randn(out, width, generator=generator).to(torch.bfloat16)
        bias = torch.randn(out, generator=generator).to(torch.bfloat16) if with_bias else None
        x = torch.randn(rows, width, generator=generator).to(torch.bfloat16)
        expected = x.float() @ weight.float().T + (bias.float() if with_bias else 0)
        projection = Projection(weight, bias, fused)
        assert projection.packed
        y = projection(x)
        assert y.dtype == torch.bfloat16 and y.shape == (rows, out)
        # float32 sums in another order, then one bf16 rounding: within two bf16 steps of the float32 value
        torch.testing.assert_close(y.float(), expected, rtol=2 * 2**-8, atol=1e-2)
        if fused.ONEDNN_MIN_ROWS and rows >= fused.ONEDNN_MIN_ROWS:  # an AMX CPU: oneDNN's own product
            assert torch.equal(y, torch.nn.functional.linear(x, weight, bias))
    for shape in ((40, 576), (48, 63)):
        weight = torch.randn(shape, generator=generator).to(torch.bfloat16)
        assert fused.pack_weight(weight).numel() == 0
        projection, x = Projection(weight, None, fused), torch.randn(rows, shape[1]).to(torch.bfloat16)
        assert not projection.packed and torch.equal(projection(x), torch.nn.functional.linear(x, weight))


@pytest.mark.kernels
def test_bf16_linear_on_amx_tiles_gives_each_row_the_same_bits_in_any_batch():
    """On the tile unit (TILE_MIN_ROWS-64 rows on an AMX CPU) each row's sums run over the inputs in one fixed
    order, whatever rows sit beside it: a response's projections do not change as other rows of its batch
    finish (8-64 rows, full tiles of 16 and a partial last tile), with and without a bias. Inputs that are not
    a multiple of 32 go to oneDNN, and the result stays within bf16 rounding."""
    from dapo_suite.inference.weights import Projection

    fused = _native_bf16()
    if not fused.TILE_MIN_ROWS:
        pytest.skip("this CPU has no AMX: bf16 `linear` runs the pair products at every row count")
    generator = torch.Generator().manual_seed(0)
    for out, width, with_bias in ((960, 576, True), (576, 1536, False), (80, 64, True), (64, 48, False)):
        weight = torch.randn(out, width, generator=generator).to(torch.bfloat16)
        bias = torch.randn(out, generator=generator).to(torch.bfloat16) if with_bias else None
        projection, x = (
            Projection(weight, bias, fused),
            torch.randn(64, width, generator=generator).to(torch.bfloat16),
        )
        whole = projection(x)
        expected = x.float() @ weight.float().T + (bias.float() if with_bias else 0)
        torch.testing.assert_close(whole.float(), expected, rtol=2 * 2**-8, atol=1e-2)
        for rows in (fused.TILE_MIN_ROWS, 15, 16, 17, 33, 63) if width % 32 == 0 else ():
            assert torch.equal(projection(x[:rows]), whole[:rows]), (out, width, rows)
            assert torch.equal(projection(x[-rows:]), whole[-rows:]), (out, width, rows)


@pytest.mark.kernels
@pytest.mark.parametrize("rows", [1, 5, 6, 8, 9, 64, 130])
def test_float32_linear_equals_aten_on_every_cpu(rows):
    """The fused float32 `linear` (weights packed in blocks of the CPU's vector width times its tile, outer
    products of float32 vectors) equals `F.linear` to float32 rounding, with and without a bias, at the
    decoder's widths, at widths that end in a narrower block, and at row counts across the tile edges (6 rows
    on AVX2, 8 on AVX-512). Weights with outputs that are not a whole number of vectors stay on `F.linear`,
    bit for bit."""
    from dapo_suite.inference.weights import Projection

    fused = _fused()
    lanes = fused.FLOAT32_LANES
    generator = torch.Generator().manual_seed(rows)
    for weight, x, bias in float32_linear_cases(fused, rows, generator):
        out = weight.shape[0]
        projection = Projection(weight, bias, fused)
        assert projection.packed
        y = projection(x)
        assert y.dtype == torch.float32 and y.shape == (rows, out)
        torch.testing.assert_close(y, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-4)
    weight = torch.randn(lanes + 1, 64, generator=generator)
    projection, x = Projection(weight, None, fused), torch.randn(rows, 64, generator=generator)
    assert not projection.packed and torch.equal(projection(x), torch.nn.functional.linear(x, weight))


def float32_linear_cases(fused, rows: int, generator: torch.Generator):
    """(weight, x, bias or None) for the float32 `linear` tests, random: the decoder's widths, widths that end
    in a narrower block, one vector of outputs; x of `rows` rows."""
    block, lanes = fused.FLOAT32_BLOCK, fused.FLOAT32_LANES
    for out, width, with_bias in (
        (960, 576, True),
        (576, 1536, False),
        (block + lanes, 64, True),
        (2 * block - lanes, 48, False),
        (lanes, 32, False),
    ):
        weight, x = (
            torch.randn(out, width, generator=generator),
            torch.randn(rows, width, generator=generator),
        )
        yield weight, x, torch.randn(out, generator=generator) if with_bias else None


def _fused():
    from dapo_suite.inference.fused_step import kernels

    fused = kernels()
    if fused is None:
        pytest.skip("the fused decode kernels could not be built here (no C++ compiler or ninja)")
    return fused


def _native_bf16():
    """The kernels with their bf16 attention and linear, which only CPUs with avx512_bf16 build."""
    fused = _fused()
    if not fused.NATIVE_BF16:
        pytest.skip("this CPU has no avx512_bf16: the bf16 attention and linear kernels are not built")
    return fused


# (queries' dtype, cache's dtype): bf16's kernels, float32's, and float32 over a bf16 cache (kv_cache_dtype)
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (torch.float32, torch.bfloat16)],
    ids=["bf16", "float32", "float32-bf16-cache"],
)
# (rows, head dim, shared prompt, query heads, key/value heads): SmolLM2's 9 / 3, and 14 / 2 (Qwen2.5-7B's 7
# query heads per key/value head: more than either dtype's kernel keeps in registers at once, so the sums go
# in groups)
@pytest.mark.parametrize(
    "rows,dim,shared,heads,kv_heads",
    [
        (1, 64, False, 9, 3),
        (5, 64, False, 9, 3),
        (6, 64, True, 9, 3),
        (3, 128, False, 9, 3),
        (4, 128, True, 14, 2),
    ],
)
@pytest.mark.kernels
def test_fused_attention_equals_rope_cache_write_and_sdpa(
    rows, dim, shared, heads, kv_heads, dtype, cache_dtype
):
    """`attend` against the float32 reference: RoPE of q and k, the step's k and v written into the cache at
    the slot (rounded to the cache's dtype), and grouped-query softmax attention over each row's valid
    positions (left padding skipped; with a shared prompt, the prompt's valid positions and then the row's
    own); bf16 within its rounding, float32 to 1e-5, over a bf16 cache too (its keys and values read
    exactly)."""
    from dapo_suite.inference.attention import sdpa_with_lse
    from dapo_suite.inference.decoding import LeanStepper

    fused = _native_bf16() if dtype == torch.bfloat16 else _fused()
    generator = torch.Generator().manual_seed(rows)
    slots, slot = 40, 23
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype)
    angles = torch.rand(rows, dim // 2, generator=generator) * 6
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    own_k, own_v = (
        torch.randn(rows, kv_heads, slots, dim, generator=generator).to(cache_dtype) for _ in range(2)
    )
    own_start = torch.randint(0, 10, (rows,), generator=generator) * (not shared)
    prompts, prompt_len = 2, 17
    prompt_k, prompt_v = (
        torch.randn(prompts, kv_heads, prompt_len, dim, generator=generator).to(cache_dtype) for _ in range(2)
    )
    prompt_start, row_prompt = torch.tensor([0, 6]), torch.arange(rows) % prompts
    expected_k, expected_v = own_k.float().clone(), own_v.float().clone()
    x = qkv.float()
    rotated = LeanStepper._rotate(
        x[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim), cos[:, None], sin[:, None]
    )
    expected_k[:, :, slot] = rotated[:, heads:].to(cache_dtype).float()
    expected_v[:, :, slot] = (
        x[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim).to(cache_dtype).float()
    )
    keys, values = expected_k[:, :, : slot + 1], expected_v[:, :, : slot + 1]
    valid = torch.arange(slot + 1) >= own_start[:, None]
    if shared:
        keys = torch.cat([prompt_k.float()[row_prompt], keys], 2)
        values = torch.cat([prompt_v.float()[row_prompt], values], 2)
        valid = torch.cat([torch.arange(prompt_len) >= prompt_start[row_prompt][:, None], valid], 1)
    bias = torch.zeros(valid.shape).masked_fill(~valid, float("-inf"))[:, None, None]
    q = rotated[:, :heads].view(rows, kv_heads, heads // kv_heads, dim)
    expected = sdpa_with_lse(q, keys, values, bias, dim**-0.5)[0].reshape(rows, heads * dim)

    empty, none = torch.empty(0, dtype=cache_dtype), torch.empty(0, dtype=torch.long)
    rows_, slots = torch.arange(rows), torch.full((rows,), slot)
    out = fused.attend(
        qkv,
        cos,
        sin,
        rows_,
        slots,
        own_k,
        own_v,
        own_start,
        *((prompt_k, prompt_v, prompt_start, row_prompt) if shared else (empty, empty, none, none)),
        heads,
        dim**-0.5,
    )
    assert out.dtype == dtype and out.shape == (rows, heads * dim)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(own_k.float(), expected_k, atol=1e-6, rtol=0)  # bf16: equal after the rounding
    assert torch.equal(own_v.float(), expected_v)


@pytest.mark.kernels
@pytest.mark.parametrize("chunk_tokens", [8192, 40])
def test_packed_prompt_pass_gives_the_float32_cache_within_bf16_rounding(
    embedded_model_dir, monkeypatch, chunk_tokens
):
    """The bf16 stepper's own prompt pass (tokens packed without padding, in chunks of whole prompts) against
    transformers' float32 prefill: keys and values at every real position within bf16 rounding carried through
    30 layers (measured: 1.4 % mean at the last layer, as autocast's prefill), zeros in the padding."""
    import dapo_suite.inference.decoding as decoding
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.inference.prefill import prefill

    _native_bf16()
    monkeypatch.setattr(decoding, "PREFILL_CHUNK_TOKENS", chunk_tokens)  # 40: one prompt per chunk, or two
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    encoded = _encoded(tokenizer)
    ids, mask = encoded["input_ids"][:, :-1], encoded["attention_mask"][:, :-1]
    with torch.no_grad():
        reference = prefill(model, ids, mask, torch.float32)
        stepper = decoding.LeanStepper(
            model, encoded["input_ids"], encoded["attention_mask"], 4, torch.bfloat16
        )
        packed = stepper._packed_prefill(ids, mask)
    real = mask.bool()
    for layer in (0, 29):
        expected = torch.stack([reference.layers[layer].keys, reference.layers[layer].values]).transpose(2, 3)
        got = packed[:, layer].float().transpose(2, 3)  # (2, prompts, width, H_kv, D)
        scale = expected[:, real].abs().mean()
        assert (got[:, real] - expected[:, real]).abs().mean() < 0.03 * scale
        assert not got[:, ~real].any()


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "float32"])
def test_fused_norm_and_gated_activation_equal_torch(dtype):
    """`add_rms_norm` (residual add in place, RMSNorm, out in the sampling dtype; without a delta, the norm
    alone) and `silu_mul` against the float32 ops they replace: bf16 rounded once, float32 to 1e-5."""
    fused = _fused()
    tolerance = {"atol": 2e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 576, generator=generator)
    delta = torch.randn(7, 576, generator=generator).to(dtype)
    weight = torch.rand(576, generator=generator) + 0.5
    expected_hidden = hidden + delta.float()
    expected = torch.nn.functional.rms_norm(expected_hidden, (576,), weight, 1e-5)
    updated = hidden.clone()
    out = fused.add_rms_norm(updated, delta, weight, 1e-5, dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(updated, expected_hidden, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.float(), expected, **tolerance)
    torch.testing.assert_close(
        fused.add_rms_norm(hidden.clone(), None, weight, 1e-5, dtype).float(),
        torch.nn.functional.rms_norm(hidden, (576,), weight, 1e-5),
        **tolerance,
    )
    gate_up = torch.randn(7, 2 * 1536, generator=generator).to(dtype)
    gate, up = gate_up.float().chunk(2, -1)
    activated = fused.silu_mul(gate_up)
    assert activated.dtype == dtype
    torch.testing.assert_close(activated.float(), torch.nn.functional.silu(gate) * up, **tolerance)


@pytest.mark.kernels
def test_fused_sampling_draws_from_the_nucleus_with_the_tempered_log_probs():
    """`sample_next`: the frequencies of the renormalised nucleus (the most likely tokens whose mass before
    each is <= top_p), log-probs of softmax(logits / T) before top-p, the whole distribution at top_p = 1,
    argmax when greedy, and a flat distribution whose nucleus holds thousands of tokens."""
    fused = _fused()
    draws = 40_000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0]).repeat(draws, 1)
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(0))
    for temperature, top_p in [(1.0, 0.8), (1.0, 1.0), (0.7, 0.95), (0.5, 0.8)]:
        probs = torch.softmax(logits[0] / temperature, -1)
        before = probs.cumsum(0) - probs
        nucleus = probs * (before <= top_p)
        tokens, log_probs, entropies = fused.sample_next(logits, temperature, top_p, uniforms)
        frequencies = torch.bincount(tokens, minlength=5).double() / draws
        torch.testing.assert_close(frequencies, (nucleus / nucleus.sum()).double(), atol=0.01, rtol=0)
        torch.testing.assert_close(
            log_probs,
            torch.log_softmax(logits / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1),
            atol=1e-6,
            rtol=0,
        )
        entropy = -(probs * probs.log()).sum()  # of softmax(logits / T), before top-p
        torch.testing.assert_close(entropies, entropy.expand(draws), atol=1e-5, rtol=0)
    tokens, log_probs, _ = fused.sample_next(torch.tensor([[0.0, 3.0, 3.0, 1.0]]), 0.0, 1.0, torch.zeros(1))
    assert tokens.tolist() == [1]
    torch.testing.assert_close(log_probs, torch.log_softmax(torch.tensor([0.0, 3.0, 3.0, 1.0]), -1)[1:2])
    flat = torch.randn(2000, 49152, generator=torch.Generator().manual_seed(1)) * 0.1  # nucleus: ~34k tokens
    tokens, _, entropies = fused.sample_next(
        flat, 1.0, 0.7, torch.rand(2000, generator=torch.Generator().manual_seed(2))
    )
    torch.testing.assert_close(
        entropies, torch.distributions.Categorical(logits=flat).entropy(), atol=1e-3, rtol=0
    )
    assert tokens.unique().numel() > 1900  # spread over the nucleus, not the 1e-4 candidates only
    for dtype in (torch.bfloat16, torch.float32):  # bf16 logits are read as they are
        assert fused.sample_next(logits[:3].to(dtype), 0.0, 1.0, torch.zeros(3))[0].tolist() == [0, 0, 0]


@pytest.mark.kernels
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_next_tokens_takes_the_fused_bf16_steps_logits_as_they_are(temperature):
    """The fused bf16 step hands its logits over in bf16: `next_tokens` (greedy or sampled) gives the tokens
    and log-probs it gives their exact float32 copy."""
    from dapo_suite.inference.sampling import next_tokens

    _fused()
    logits = (torch.randn(4, 300, generator=torch.Generator().manual_seed(7)) * 3).to(torch.bfloat16)
    uniforms = torch.rand(4, generator=torch.Generator().manual_seed(8))
    tokens, log_probs, entropies = next_tokens(logits, temperature, 0.9, None, uniforms)
    expected_tokens, expected_log_probs, expected_entropies = next_tokens(
        logits.float(), temperature, 0.9, None, uniforms
    )
    assert tokens.tolist() == expected_tokens.tolist() and log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs, expected_log_probs, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropies, expected_entropies, atol=1e-5, rtol=0)


@pytest.mark.kernels
def test_fused_sampling_draws_the_torch_samplers_token_from_the_same_uniform():
    """From the same generator state, `sample_next` and the torch sampler it replaced (`sample_top_p`, still
    the path where the kernel is not built) draw the same tokens: one uniform per row, the same nucleus, the
    same inverse-CDF draw; a fixed seed gives the same samples as before the kernel."""
    from dapo_suite.inference.sampling import sample_top_p

    fused = _fused()
    logits = torch.randn(512, 1000, generator=torch.Generator().manual_seed(3)) * 4
    for top_p in (0.9, 1.0):
        tokens, _, _ = fused.sample_next(
            logits, 1.0, top_p, torch.rand(512, generator=torch.Generator().manual_seed(5))
        )
        reference = sample_top_p(torch.log_softmax(logits, -1), top_p, torch.Generator().manual_seed(5))
        assert (tokens == reference).float().mean() > 0.99  # a row may differ where rounding moves a boundary


def test_bfloat16_sampling_without_a_cxx_compiler_falls_back_to_torch_ops_and_says_so(tmp_path):
    """Where the fused kernels cannot be built (no C++ compiler), bf16 sampling still runs, on torch's ops,
    with a warning that names the cause and the fix (a fresh extension cache, so nothing built earlier is
    used)."""
    import os
    import subprocess
    import sys

    script = (
        "import warnings, torch\nfrom dapo_suite.inference.models import load_model_and_tokenizer\nfrom "
        "dapo_suite.inference.sampling import sample_tokens\nmodel, tok = load_model_and_tokenizer(None); "
        "model.eval()\nenc = tok(['Say hi.'] * 4, return_tensors='pt', padding=True)\nwith "
        "warnings.catch_warnings(record=True) as caught:\n    warnings.simplefilter('always')\n    s = "
        "sample_tokens(model, enc['input_ids'], enc['attention_mask'], 6, 1.0, 0.9, {tok.eos_token_id},\n    "
        "                  tok.pad_token_id, dtype=torch.bfloat16)\nprint('ROWS', len(s.lengths), 'ALL "
        "GENERATED', bool((s.lengths >= 1).all()))\nprint('WARNINGS', [str(w.message) for w in caught if "
        "'fused decode kernels' in str(w.message)])\n"
    )
    env = {
        **os.environ,
        "CXX": str(tmp_path / "no-such-g++"),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ROWS 4 ALL GENERATED True" in result.stdout
    warning = result.stdout.split("WARNINGS", 1)[1]
    assert "fused decode kernels unavailable" in warning and "g++ or clang" in warning and "ninja" in warning


def test_a_build_lock_left_by_a_killed_build_is_removed_instead_of_waited_on(tmp_path):
    """A process killed while it compiled the kernels leaves torch's build lock: later runs waited on it
    forever. An old lock is removed with a warning; a fresh one (a build running now) is left alone."""
    import os
    import time
    import warnings

    from dapo_suite.inference.fused_step import STALE_LOCK_SECONDS, clear_stale_lock

    lock = tmp_path / "lock"
    lock.write_text("")
    clear_stale_lock(lock)
    assert lock.exists()
    old = time.time() - STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clear_stale_lock(lock)
    assert not lock.exists() and "stale build lock" in str(caught[0].message)
    clear_stale_lock(lock)  # no lock: nothing happens


def test_a_build_lock_that_turns_stale_while_waited_on_is_removed_and_the_wait_ends(tmp_path, monkeypatch):
    """torch's FileBaton waits on a lock forever. A lock made by a build that was killed just now (young, so
    not removed up front) is watched during the wait: the waiter says what it waits on, and the wait ends once
    the lock is older than STALE_LOCK_SECONDS."""
    import time
    import warnings

    from torch.utils.file_baton import FileBaton

    from dapo_suite.inference import fused_step

    monkeypatch.setattr(fused_step, "STALE_LOCK_SECONDS", 2)
    lock = tmp_path / "lock"
    lock.write_text("")  # the killed build's
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fused_step.waiting_on_lock(lock, poll_seconds=0.2):
            baton = FileBaton(str(lock), wait_seconds=0.1)
            assert not baton.try_acquire()
            baton.wait()  # returns once the watcher removed the stale lock
    assert not lock.exists() and time.monotonic() - start < 30
    messages = [str(w.message) for w in caught]
    assert any("waiting for another process's build" in m for m in messages)
    assert any("stale build lock" in m for m in messages)


def test_kernels_built_without_avx512_bf16_keep_the_sampler_and_decode_with_torch_ops(
    embedded_model_dir, tmp_path, monkeypatch
):
    """On a CPU without avx512_bf16 the module builds without the attention and linear kernels (NATIVE_BF16
    false): `sample_next` still draws the tokens, and the bf16 stepper decodes with torch's ops. Where this
    CPU has avx512_bf16, built here with -mno-avx512bf16 into a fresh extension cache; elsewhere its own build
    is that one."""
    import dapo_suite.inference.decoding as decoding
    import dapo_suite.inference.sampling as sampling
    import dapo_suite.inference.weights as weights
    from dapo_suite.inference.fused_step import CFLAGS, SOURCES
    from dapo_suite.inference.models import load_model_and_tokenizer

    plain = _fused()  # a compiler and ninja are here
    if plain.NATIVE_BF16:
        from torch.utils import cpp_extension

        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
        plain = cpp_extension.load(
            name="dapo_decode_step_no_bf16",
            sources=[str(path) for path in SOURCES],
            extra_cflags=CFLAGS + ["-mno-avx512bf16", "-mno-amx-bf16"],
            extra_ldflags=["-fopenmp"],
        )
    assert plain.NATIVE_BF16 is False
    assert plain.pack_weight(torch.zeros(16, 64, dtype=torch.bfloat16)).numel() == 0
    monkeypatch.setattr(weights, "kernels", lambda: plain)
    monkeypatch.setattr(sampling, "kernels", lambda: plain)
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    encoded = tokenizer(["Say hi.", "What is 2 + 3?"], return_tensors="pt", padding=True)
    assert (
        decoding.LeanStepper(
            model, encoded["input_ids"], encoded["attention_mask"], 4, torch.bfloat16
        ).kernels
        is None
    )
    with torch.no_grad():
        sampled = sampling.sample_tokens(
            model,
            encoded["input_ids"],
            encoded["attention_mask"],
            6,
            1.0,
            0.9,
            {tokenizer.eos_token_id},
            tokenizer.pad_token_id,
            dtype=torch.bfloat16,
            generator=torch.Generator().manual_seed(0),
        )
    assert (sampled.lengths >= 1).all() and torch.isfinite(sampled.log_probs).all()


@pytest.mark.kernels
def test_the_kernels_are_built_for_the_target_asked_for():
    """-march=native builds the float32 kernels on this CPU's widest vectors and the bf16 ones where it has
    avx512_bf16; $DAPO_SUITE_KERNEL_ARCH=x86-64-v3 (`make test-avx2`) builds what an AVX2-only CPU runs
    (8-float vectors, no bf16 dot products), whatever this CPU has beyond it."""
    from pathlib import Path

    from dapo_suite.inference.fused_step import build_flags

    fused = _fused()
    arch = build_flags()[0]
    if arch == "x86-64-v3":
        assert (fused.FLOAT32_VECTORS, fused.FLOAT32_LANES, fused.NATIVE_BF16) == ("avx2", 8, False)
    elif arch == "native" and Path("/proc/cpuinfo").is_file():
        flags = set(
            next(
                line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
            ).split()
        )
        widest = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else None
        if widest:
            assert fused.FLOAT32_VECTORS == widest
        assert fused.NATIVE_BF16 == ("avx512_bf16" in flags)
    else:
        pytest.skip(f"a build for -march={arch}: nothing to compare it with")
