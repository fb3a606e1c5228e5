"""Quantized rollout weights (`rollout_quantization: int8` and `int4`): the sampler's copy of each projection
in int8 per output channel or int4 per group of 32, its kernels against the dequantized product, and its
samples' log-probs against the trainer's (the trainer's side: tests/train/test_train.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_sampler import _encoded, _fused, _sample, float32_linear_cases
from test_stepper_models import SMALL


def test_int8_quantization_rounds_each_weight_to_within_half_its_channels_step():
    """W ~ q s, s_o = max |W_o| / 127: every weight within s_o / 2 of its dequantized value, the largest of
    each channel exact, zero rows kept finite."""
    from dapo_suite.inference.weights import quantize_int8

    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    weight[3] = 0.0
    q, scales = quantize_int8(weight)
    assert q.dtype == torch.int8 and scales.shape == (64,) and torch.isfinite(scales).all()
    error = (q.float() * scales[:, None] - weight).abs()
    assert (error <= scales[:, None] / 2 * (1 + 1e-6)).all()
    assert (q.abs().amax(1)[torch.arange(64) != 3] == 127).all()
    assert (q[3] == 0).all()


def test_int4_quantization_keeps_each_groups_largest_weight_exact_and_the_rest_within_a_step():
    """Q4_0's rule per group of 32: s = m / -8 for the weight m of largest magnitude (a float16 value), that
    weight exactly -8 s, the others within s / 2 (within s where 7 caps a weight of the other sign), a zero
    group kept finite, a narrower last group quantized as if zero-padded."""
    from dapo_suite.inference.weights import QUANTIZERS, quantize_int4

    weight = torch.randn(16, 80, generator=torch.Generator().manual_seed(0))
    weight[2, 32:64] = 0.0
    q, scales = quantize_int4(weight)
    assert q.dtype == torch.int8 and q.shape == (16, 80) and scales.shape == (16, 3)
    assert q.min() >= -8 and q.max() <= 7 and torch.isfinite(scales).all()
    assert torch.equal(scales, scales.half().float())
    dequantized, _ = QUANTIZERS["int4"].unpacked(q, scales)
    step = scales.abs().repeat_interleave(32, 1)[:, :80]
    error = (dequantized - weight).abs()
    assert (error <= step * (1 + 1e-3)).all()
    assert (error[q < 7] <= step[q < 7] / 2 * (1 + 1e-3)).all()
    largest = torch.nn.functional.pad(weight, (0, 16)).view(16, 3, 32).abs().argmax(-1)
    for o in range(16):
        for g in range(3):
            if scales[o, g] != 0:
                assert q[o, 32 * g + largest[o, g]] == -8
    assert (q[2, 32:64] == 0).all() and scales[2, 1] == 0


def _activations_as_quantized(x: torch.Tensor) -> torch.Tensor:
    """x as the integer dot products see it (csrc/quantized.cpp): int8 per row and group of 32, d = max |x| /
    127, round half to even; float64."""
    groups = x.double().view(x.shape[0], -1, 32)
    most = groups.abs().amax(-1, keepdim=True)
    scale = (most.float() / 127).double()  # the kernel's d, a float32
    inverse = torch.where(most > 0, (127 / most.float()).double(), torch.zeros_like(most))
    q = (groups.float() * inverse.float()).round().double()  # the kernel rounds x * (127 / max) in float32
    return (q * scale).view_as(x)


@pytest.mark.kernels
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 9, 64, 130])
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_quantized_linear_equals_the_dequantized_product_on_every_cpu(name, rows):
    """The fused `linear` on quantized weights against x (q s)^T + b in float64, at the decoder's widths,
    widths ending in a narrower block and row counts across the tile edges. With integer dot products
    (int8: avx512_vnni, `INT8_DOTS`; int4: avx512_vnni or AVX2, `INT4_DOTS`; I % 32 == 0) x is quantized per
    group of 32 first, and the product equals that x's to float32 rounding; elsewhere int8 runs the widened
    float32 tile and int4 torch's `F.linear` on the dequantized weight, both on x as given. Where the kernels
    are absent, torch's ops give the same."""
    from dapo_suite.inference.weights import QUANTIZERS, Projection

    fused = _fused()
    weight_format = QUANTIZERS[name]
    generator = torch.Generator().manual_seed(rows)
    for weight, x, bias in float32_linear_cases(fused, rows, generator):
        out, width = weight.shape
        q, scales = weight_format.quantize(weight)
        dequantized = (
            q.double() * scales.double()[:, None]
            if name == "int8"
            else weight_format.unpacked(q, scales)[0].double()
        )
        built = fused.INT8_DOTS if name == "int8" else fused.INT4_DOTS
        dots = built and width % 32 == 0 and out % 16 == 0
        seen = _activations_as_quantized(x) if dots else x.double()
        expected = torch.nn.functional.linear(seen, dequantized, None if bias is None else bias.double())
        # float32 sums of `width` products, in any order: within a few rounding steps of their magnitudes' sum
        bound = 1e-6 * (seen.abs() @ dequantized.abs().T) + 1e-6
        projection = Projection(weight, bias, fused, quantization=name)
        if dots:  # unsigned weights (q + offset), then scales: int8 (O, I + 4), int4 (O, I / 2 + I / 16)
            assert projection.packed and projection.weight.dtype == torch.uint8
            per_output = width + 4 if name == "int8" else width // 2 + width // 16
            assert projection.weight.shape == (out, per_output)  # no other copy kept
        elif name == "int8":  # int8 weights and float32 scales
            assert projection.packed and projection.weight.numel() == out * (width + 4)
        else:
            assert not projection.packed
        y = projection(x)
        assert y.dtype == torch.float32 and y.shape == (rows, out)
        assert ((y.double() - expected).abs() <= bound).all(), (out, width)
        unfused = Projection(weight, bias, None, quantization=name)
        assert not unfused.packed
        plain = torch.nn.functional.linear(x.double(), dequantized, None if bias is None else bias.double())
        plain_bound = 1e-6 * (x.double().abs() @ dequantized.abs().T) + 1e-6
        assert ((unfused(x).double() - plain).abs() <= plain_bound).all(), (out, width)


def test_int8_sampling_reports_its_own_log_probs_near_the_trainers(embedded_model_dir):
    """Samples from int8 weights carry the sampler's log-probs, which differ from the float32 model's (the
    mismatch rollout correction weighs) but stay near them: the same distribution, slightly moved. (int4 moves
    the embedded 135M model's far more: docs/results/quantized-rollouts/.)"""
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.inference.weights import StepperWeights

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    weights = StepperWeights(model, quantization="int8")
    assert weights.dtype == torch.float32
    encoded = _encoded(tokenizer)
    sampled = _sample(model, tokenizer, "auto", torch.float32, samples_per_prompt=2, weights=weights)
    mask = torch.arange(sampled.tokens.shape[1]) < sampled.lengths[:, None]
    ids = torch.cat([encoded["input_ids"].repeat_interleave(2, 0), sampled.tokens], dim=1)
    attention = torch.cat([encoded["attention_mask"].repeat_interleave(2, 0), mask.long()], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits.float()
    prompt_len = encoded["input_ids"].shape[1]
    trainer = logits[:, prompt_len - 1 : -1].log_softmax(-1).gather(-1, sampled.tokens[..., None])[..., 0]
    difference = (trainer - sampled.log_probs).abs()[mask]
    assert 0 < difference.max() < 2.0, difference.max()
    assert difference.mean() < 0.1, difference.mean()


@pytest.mark.kernels
@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_a_bf16_kv_cache_under_float32_activations_moves_next_token_probabilities_little(
    embedded_model_dir, quantization
):
    """`kv_cache_dtype: bfloat16` under float32 activations (the float32 sampler, int8 and int4 weights): the
    stepper keeps its prompt's and its own keys and values in bf16, half the bytes attention reads. Over 12
    teacher-forced steps (the prompt pass included), the divergence of its next-token distribution from the
    float32 cache's (KL, nats) is tiny for float32 weights (measured: 2e-5 mean) and below what the weights'
    own quantization moves it from the float32 model's (int8: 0.004 against 0.010; int4: 0.004 against 0.34:
    int8 activations round a group at a time, so a small change in the cache flips some roundings)."""
    from dapo_suite.inference.decoding import LeanStepper
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.inference.weights import StepperWeights

    _fused()
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    encoded = _encoded(tokenizer)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    settings = {
        "float32 model": (None, "auto"),
        "auto": (quantization, "auto"),
        "bf16": (quantization, "bfloat16"),
    }
    with torch.no_grad():
        steppers = {
            name: LeanStepper(
                model, ids, mask, 12, torch.float32, weights=StepperWeights(model, torch.float32, *kv)
            )
            for name, kv in settings.items()
        }
        assert steppers["auto"].kv.dtype == torch.float32 and steppers["bf16"].kv.dtype == torch.bfloat16
        tokens, positions, cache_kl, quantization_kl = ids[:, -1], mask.sum(-1) - 1, [], []
        for _ in range(12):
            log_p = {name: s.step(tokens, positions).float().log_softmax(-1) for name, s in steppers.items()}
            cache_kl.append((log_p["auto"].exp() * (log_p["auto"] - log_p["bf16"])).sum(-1))
            quantization_kl.append(
                (log_p["float32 model"].exp() * (log_p["float32 model"] - log_p["auto"])).sum(-1)
            )
            tokens, positions = log_p["auto"].argmax(-1), positions + 1
    cache_kl, quantization_kl = torch.stack(cache_kl), torch.stack(quantization_kl)
    assert cache_kl.max() > 0  # the cache was rounded
    if quantization is None:
        assert cache_kl.mean() < 1e-3 and cache_kl.max() < 1e-2, (cache_kl.mean(), cache_kl.max())
    else:
        assert cache_kl.mean() < quantization_kl.mean(), (cache_kl.mean(), quantization_kl.mean())


def test_int8_rollouts_for_a_model_the_lean_stepper_cannot_run_are_refused_not_sampled_unquantized():
    """Quantized weights live in the lean stepper's snapshot: a model that decodes through transformers' own
    step (here a dynamic RoPE scaling) would sample from its full-precision weights, so the engine refuses."""
    import transformers

    from dapo_suite.core.errors import UserError
    from dapo_suite.inference.engines import HFEngine

    config = transformers.LlamaConfig(
        **SMALL, head_dim=64, rope_scaling={"rope_type": "dynamic", "factor": 2.0}
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with warnings.catch_warnings():  # lean_supported says why once per process
        warnings.simplefilter("ignore")
        with pytest.raises(UserError, match="rollout_quantization int8: LlamaForCausalLM decodes with"):
            HFEngine(model, tokenizer=None, quantization="int8")


def test_int4_weights_no_kernel_takes_are_decoded_by_torch_with_a_warning_once():
    """int4 weights no fused kernel takes (widths not in whole groups of 32, a head size the kernels lack, a
    CPU with neither AVX-512 VNNI nor AVX2) fall back to torch's ops on the dequantized weight: the snapshot
    says so once a process, not at every weight sync."""
    import transformers

    from dapo_suite.inference import weights as weights_module

    config = transformers.LlamaConfig(**{**SMALL, "hidden_size": 240, "intermediate_size": 496}, head_dim=60)
    model = transformers.LlamaForCausalLM(config).eval()
    weights_module._warn_unfused.cache_clear()
    with pytest.warns(UserWarning, match="rollout_quantization int4: no fused kernel takes these weights"):
        snapshot = weights_module.StepperWeights(model, quantization="int4")
    assert snapshot.kernels is None and not snapshot.lm_head.packed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights_module.StepperWeights(model, quantization="int4")  # the next sync: no second warning
