"""The chunked LM head (`lm_head.head_log_probs`) against the reference path: the model's full logits into
`token_log_probs` and `entropy_from_logits`, values and gradients, across chunk boundaries."""

import pytest
import torch

from dapo_suite.train.algorithm import entropy_from_logits, token_log_probs
from dapo_suite.train.lm_head import head_log_probs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [4, 1000])
def test_chunked_head_matches_full_logits_in_values_and_gradients(temperature, chunk):
    torch.manual_seed(0)
    hidden = torch.randn(11, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (11,))
    upstream = torch.randn(11, dtype=torch.float64)

    logits = hidden @ weight.T / temperature
    expected = token_log_probs(logits[None], targets[None])[0]
    expected_entropy = entropy_from_logits(logits[None])[0]
    (expected * upstream).sum().backward()
    expected_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad, weight.grad = None, None

    log_prob, entropy = head_log_probs(hidden, weight, targets, temperature, torch.float64, chunk)
    (log_prob * upstream).sum().backward()
    torch.testing.assert_close(log_prob.double(), expected, atol=1e-6, rtol=1e-6)  # float32 out
    torch.testing.assert_close(entropy.double(), expected_entropy.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(hidden.grad, expected_grads[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weight.grad, expected_grads[1], atol=1e-6, rtol=1e-5)
    assert not entropy.requires_grad


def test_bf16_head_stays_within_bf16_rounding_of_the_exact_one():
    torch.manual_seed(1)
    hidden = torch.randn(37, 64) / 4
    weight = torch.randn(300, 64) / 4
    targets = torch.randint(0, 300, (37,))
    exact, _ = head_log_probs(hidden, weight, targets, 1.0, torch.float32, 8)
    mixed, _ = head_log_probs(hidden, weight, targets, 1.0, torch.bfloat16, 8)
    assert 0 < float((exact - mixed).abs().max()) < 0.05
