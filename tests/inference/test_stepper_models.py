"""The lean stepper on the current small models' architectures: Qwen3 (per-head q/k RMSNorm before RoPE) and
Llama 3.x (`llama3` RoPE scaling), against transformers' own step; and the warning of a model that falls
back."""

from __future__ import annotations

import warnings

import pytest
import torch

# The real configs' architecture fields (Qwen3-0.6B; Llama-3.2-1B-Instruct) at a size that decodes in seconds;
# head dims as the real ones (128 and 64: the sizes the fused `attend` is compiled for).
SMALL = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
QWEN3 = dict(
    head_dim=128,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    attention_bias=False,
    hidden_act="silu",
)
LLAMA3 = dict(
    head_dim=64,
    rope_theta=500_000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=131072,
    hidden_act="silu",
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)


def _model(architecture: str):
    """A random-weight float32 model; norms (Qwen3's q/k norms too) drawn away from 1, weights at a scale
    whose next-token distributions are peaked (greedy has no near-ties for rounding to flip)."""
    import transformers

    config_class, model_class, fields = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, QWEN3),
        "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, LLAMA3),
    }[architecture]
    torch.manual_seed(0)
    model = model_class(config_class(**SMALL, **fields, initializer_range=0.08)).float().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    return model


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Four left-padded prompts of random tokens, 3 to 40 long (the 40-token one past the first RoPE
    octave)."""
    generator = torch.Generator().manual_seed(1)
    lengths = [40, 3, 17, 9]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, -length:] = torch.randint(2, SMALL["vocab_size"], (length,), generator=generator)
        mask[row, -length:] = 1
    return ids, mask


def _sample(model, decoder: str, temperature: float, monkeypatch, fused: bool):
    """Three seeded samples of each prompt, and the lean steppers that made them (none: transformers'
    step)."""
    import dapo_suite.inference.decoding as decoding
    import dapo_suite.inference.weights as weights
    from dapo_suite.inference.sampling import sample_tokens

    steppers = []
    lean = decoding.LeanStepper
    with monkeypatch.context() as patch:
        if not fused:
            patch.setattr(weights, "kernels", lambda: None)
        patch.setattr(
            decoding,
            "LeanStepper",
            lambda *args, **kwargs: steppers.append(lean(*args, **kwargs)) or steppers[-1],
        )
        ids, mask = _prompts()
        batch = sample_tokens(
            model,
            ids,
            mask,
            24,
            temperature,
            0.9,
            {1},
            0,
            samples_per_prompt=3,
            generator=torch.Generator().manual_seed(7),
            dtype=torch.float32,
            decoder=decoder,
        )
    return batch, steppers


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
@pytest.mark.parametrize("path", ["fused kernels", "torch ops"])
@pytest.mark.parametrize("architecture", ["qwen3", "llama3"])
def test_lean_stepper_samples_transformers_tokens_for_qwen3_and_llama3(
    architecture, path, temperature, monkeypatch
):
    """float32, same seed: the lean stepper (not the fallback) draws transformers' tokens, log-probs to
    1e-4."""
    import dapo_suite.inference.decoding as decoding

    if path == "fused kernels":
        from dapo_suite.inference.fused_step import kernels

        if kernels() is None:
            pytest.skip("the fused decode kernels could not be built here (no C++ compiler or ninja)")
    model = _model(architecture)
    if (
        architecture == "llama3"
    ):  # the scaled frequencies differ from the default ones: the scaling is in force
        assert model.config.rope_parameters["rope_type"] == "llama3"
        default = 1.0 / 500_000.0 ** (torch.arange(0, 64, 2).float() / 64)
        assert not torch.allclose(model.model.rotary_emb.inv_freq, default)
    else:
        assert model.model.layers[0].self_attn.q_norm.weight.std() > 0.1  # the q/k norms are not the identity
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        assert decoding.lean_refusal(model) is None and decoding.lean_supported(model)
    reference, hf_steppers = _sample(model, "hf", temperature, monkeypatch, path == "fused kernels")
    lean, lean_steppers = _sample(model, "auto", temperature, monkeypatch, path == "fused kernels")
    assert not hf_steppers and len(lean_steppers) == 1  # the lean stepper ran, on the path asked for
    assert (lean_steppers[0].kernels is not None) == (path == "fused kernels")
    assert len(set(map(tuple, reference.tokens.tolist()))) > 3  # not one repeated sequence
    assert torch.equal(lean.tokens, reference.tokens)
    assert torch.equal(lean.lengths, reference.lengths) and torch.equal(lean.stopped, reference.stopped)
    torch.testing.assert_close(lean.log_probs, reference.log_probs, atol=1e-4, rtol=0)


def test_a_model_the_lean_stepper_does_not_implement_falls_back_with_one_warning_naming_why(monkeypatch):
    """A dynamic RoPE scaling (frequencies recomputed per length) decodes through transformers' step, and says
    so once per process, with the reason; the tokens are transformers'."""
    import transformers

    import dapo_suite.inference.decoding as decoding

    monkeypatch.setattr(decoding, "_WARNED_REFUSALS", set())
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **SMALL, head_dim=64, rope_scaling={"rope_type": "dynamic", "factor": 2.0}
    )
    model = transformers.LlamaForCausalLM(config).float().eval()
    ids, mask = _prompts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stepper = decoding.make_stepper(model, ids, mask, 4)
        decoding.make_stepper(model, ids, mask, 4)
        assert not decoding.lean_supported(model)
    said = [str(w.message) for w in caught if "transformers' step" in str(w.message)]
    assert isinstance(stepper, decoding.HFStepper)
    assert len(said) == 1 and "rope_type 'dynamic'" in said[0] and "LlamaForCausalLM" in said[0]
    model.config.model_type = "olmo"  # another reason is said once too
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not decoding.lean_supported(model) and not decoding.lean_supported(model)
    assert [str(w.message) for w in caught].count(
        "LlamaForCausalLM decodes with transformers' step (slower), not the lean stepper: model_type 'olmo' "
        "is not one of the lean stepper's llama, qwen2, qwen3"
    ) == 1


@pytest.mark.parametrize("architecture", ["qwen3", "llama3"])
def test_bf16_fused_step_is_the_float32_step_within_bf16_rounding(architecture):
    """The fused bf16 step (q/k norms and scaled RoPE included) gives transformers' float32 next-token
    log-probs within bf16 rounding, and its most likely tokens."""
    import dapo_suite.inference.decoding as decoding
    from dapo_suite.inference.fused_step import kernels

    if kernels() is None or not kernels().NATIVE_BF16:
        pytest.skip("the bf16 fused kernels need avx512_bf16")
    model = _model(architecture)
    ids, mask = _prompts()
    positions = mask.sum(-1) - 1
    stepper = decoding.LeanStepper(model, ids, mask, 4, torch.bfloat16)
    assert stepper.kernels is not None
    lean = torch.log_softmax(stepper.step(ids[:, -1], positions).float(), -1)
    reference = torch.log_softmax(
        decoding.make_stepper(model, ids, mask, 4, decoder="hf").step(ids[:, -1], positions), -1
    )
    assert torch.equal(lean.argmax(-1), reference.argmax(-1))
    torch.testing.assert_close(lean, reference, atol=0.2, rtol=0)
