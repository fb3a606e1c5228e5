"""Quantized rollout weights (`rollout_quantization: int8`): the sampler's copy of each projection in int8 per
output channel, its kernel against the dequantized product, and its samples' log-probs against the trainer's
(the trainer's side: tests/train/test_train.py)."""

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


@pytest.mark.kernels
@pytest.mark.parametrize("rows", [1, 5, 6, 8, 9, 64, 130])
def test_int8_linear_equals_the_dequantized_product_on_every_cpu(rows):
    """The fused `linear` on int8 blocks (the float32 tile, weights widened as read, scaled per output) equals
    x (q s)^T + b (in float64) to float32 rounding at the decoder's widths, at widths ending in a narrower
    block and at row counts across the tile edges; where the kernels are absent, torch's own int8 weight-only
    matmul gives the same values."""
    from dapo_suite.inference.weights import Projection, quantize_int8

    fused = _fused()
    generator = torch.Generator().manual_seed(rows)
    for weight, x, bias in float32_linear_cases(fused, rows, generator):
        out, width = weight.shape
        q, scales = quantize_int8(weight)
        dequantized = q.double() * scales.double()[:, None]
        expected = torch.nn.functional.linear(
            x.double(), dequantized, None if bias is None else bias.double()
        )
        # float32 sums of `width` products, in any order: within a few rounding steps of their magnitudes' sum
        bound = 1e-6 * (x.double().abs() @ dequantized.abs().T) + 1e-6
        projection = Projection(weight, bias, fused, quantization="int8")
        assert projection.packed and projection.weight.dtype == torch.int8
        assert projection.weight.numel() == out * (width + 4)  # int8 weights and float32 scales, no copy kept
        y = projection(x)
        assert y.dtype == torch.float32 and y.shape == (rows, out)
        assert ((y.double() - expected).abs() <= bound).all(), (out, width)
        unfused = Projection(weight, bias, None, quantization="int8")
        assert not unfused.packed
        assert ((unfused(x).double() - expected).abs() <= bound).all(), (out, width)


def test_int8_sampling_reports_its_own_log_probs_near_the_trainers(embedded_model_dir):
    """Samples from int8 weights carry the sampler's log-probs, which differ from the float32 model's (the
    mismatch rollout correction weighs) but stay near them: the same distribution, slightly moved."""
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
