"""The actor: the policy's update side, as verl's `dp_actor` is: log-probs and entropy from the model's
forward pass, the rollout-correction weights, and the mini-batch updates (DAPO's or a successor's loss, AdamW,
the learning-rate schedule). `DAPOTrainer` owns the loop (rollout, reward, filter, advantages) and hands the
kept groups here; the loss itself is `algorithm.policy_loss`, given the config's `LossHyperparameters` whole.
"""

from __future__ import annotations

import torch

from dapo_suite.core.errors import UserError
from dapo_suite.inference.models import eval_mode
from dapo_suite.train.algorithm import policy_loss
from dapo_suite.train.config import TrainConfig
from dapo_suite.train.lm_head import head_log_probs
from dapo_suite.train.rollout import Rollout
from dapo_suite.train.rollout_correction import rollout_correction


def padded(rows: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Unpadded (T_i,) rows -> (B, max T_i), right-padded with 0, on `device`."""
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True).to(device)


def prompt_segments(rollouts: list[Rollout]) -> list[list[Rollout]]:
    """Consecutive rollouts with the same prompt (a group, or the part of one in a micro-batch), in order."""
    segments: list[list[Rollout]] = []
    for rollout in rollouts:
        if segments and torch.equal(segments[-1][0].prompt_ids, rollout.prompt_ids):
            segments[-1].append(rollout)
        else:
            segments.append([rollout])
    return segments


def forward_tokens(rollouts: list[Rollout], shared: bool) -> int:
    """Tokens a forward pass over `rollouts` runs: each segment's prompt once when prompts are shared."""
    if not shared:
        return sum(r.prompt_ids.numel() + r.length for r in rollouts)
    return sum(s[0].prompt_ids.numel() + sum(r.length for r in s) for s in prompt_segments(rollouts))


class Actor:
    """The trainable policy: `model` (whose parameters that require a gradient train), its AdamW optimiser and
    its warm-up schedule, configured by `config`."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, config: TrainConfig) -> None:
        self.model, self.pad_token_id, self.config = model, pad_token_id, config
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        # The update runs the decoder and reads the head's weight itself (lm_head.py): a plain linear head.
        self.decoder, self.head = model.get_decoder(), model.get_output_embeddings()
        if type(self.head) is not torch.nn.Linear or self.head.bias is not None:
            raise UserError(
                f"the output head is a {type(self.head).__name__} (bias: {self.head.bias is not None}):"
                " the update reads a bias-free torch.nn.Linear head (leave lm_head out of lora_targets)"
            )
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=config.lr, betas=(0.9, 0.999), weight_decay=config.weight_decay, fused=True
        )
        # Constant learning rate after a linear warm-up over optimiser *steps* (rollout steps x updates).
        warmup_updates = max(config.warmup_steps, 0) * config.updates_per_step
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda update: min(1.0, (update + 1) / warmup_updates) if warmup_updates else 1.0
        )

    @torch.no_grad()
    def old_log_probs(self, rollouts: list[Rollout]) -> None:
        """log pi_old from this model's forward pass, micro-batch by micro-batch, on the model's own tokens (0
        on a tool's), into each rollout's `old_log_prob`."""
        with eval_mode(self.model):
            for start in range(0, len(rollouts), self.config.micro_batch_size):
                micro = rollouts[start : start + self.config.micro_batch_size]
                log_prob, _, _ = self.forward_log_probs(micro)
                for row, rollout in enumerate(micro):
                    rollout.old_log_prob = log_prob[row, : rollout.length].cpu() * rollout.mask

    def forward_log_probs(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi_theta and entropy of each response token, responses right-padded, 0 where no loss is read
        (a tool's tokens, padding: the head runs only on the model's own tokens, `lm_head.head_log_probs`).
        Returns (log_prob, entropy, response_mask), each (B, T)."""
        response_len = max(r.length for r in rollouts)
        autocast = self.config.autocast_dtype
        dtype = getattr(torch, autocast) if autocast else torch.float32
        with torch.autocast(self.model.device.type, dtype=dtype, enabled=autocast is not None):
            if self.shares_prompts:
                hidden = torch.cat(
                    [
                        self._shared_prompt_hidden(segment, response_len)
                        for segment in prompt_segments(rollouts)
                    ]
                )
            else:
                hidden = self._padded_hidden(rollouts, response_len)
        mask = padded([r.mask for r in rollouts], hidden.device)  # a tool's tokens: context, never trained
        targets = padded([r.response_ids for r in rollouts], hidden.device)
        read = mask.bool()
        log_prob, entropy = head_log_probs(
            hidden[read], self.head.weight, targets[read], self.config.temperature, dtype
        )
        zeros = torch.zeros(read.shape, device=hidden.device)
        return zeros.masked_scatter(read, log_prob), zeros.masked_scatter(read, entropy), mask

    @property
    def shares_prompts(self) -> bool:
        """Whether the forward pass runs a group's prompt once: not under gradient checkpointing, whose layers
        keep no cache to share a prompt through."""
        return not self.model.is_gradient_checkpointing

    def _shared_prompt_hidden(self, rollouts: list[Rollout], response_len: int) -> torch.Tensor:
        """Final hidden states predicting each response token, (B, response_len, H), for rollouts that share
        one prompt: the prompt runs once and its keys and values are repeated for every response, which is
        the same maths as running each row whole (gradients from all responses sum into the one prompt pass)
        for 1/G of the prompt's cost, which matters most where prompts are long against responses, as the
        demo's are (docs/train.md)."""
        device = self.model.device
        prompt = rollouts[0].prompt_ids.to(device)
        prompt_out = self.decoder(input_ids=prompt[None], use_cache=True)
        cache = prompt_out.past_key_values
        cache.batch_repeat_interleave(len(rollouts))
        responses = padded([r.response_ids for r in rollouts], device)
        response_mask = padded([torch.ones(r.length, dtype=torch.long) for r in rollouts], device)
        attention = torch.cat([response_mask.new_ones(len(rollouts), prompt.numel()), response_mask], dim=1)
        position_ids = (prompt.numel() + torch.arange(responses.shape[1], device=device)).expand_as(responses)
        response_hidden = self.decoder(
            input_ids=responses,
            attention_mask=attention,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=False,
        ).last_hidden_state
        # The prompt's last position predicts response token 0; response position t predicts token t + 1.
        last = prompt_out.last_hidden_state[:, -1:].expand(len(rollouts), 1, -1)
        hidden = torch.cat([last, response_hidden[:, :-1]], dim=1)
        return torch.nn.functional.pad(hidden, (0, 0, 0, response_len - hidden.shape[1]))

    def _padded_hidden(self, rollouts: list[Rollout], response_len: int) -> torch.Tensor:
        """Final hidden states predicting each response token, (B, response_len, H): every row whole, prompts
        left-padded."""
        pad = self.pad_token_id
        prompt_len = max(r.prompt_ids.numel() for r in rollouts)
        rows, masks = [], []
        for r in rollouts:
            left = prompt_len - r.prompt_ids.numel()
            right = response_len - r.length
            rows.append(
                torch.cat([torch.full((left,), pad), r.prompt_ids, r.response_ids, torch.full((right,), pad)])
            )
            masks.append(
                torch.cat(
                    [torch.zeros(left), torch.ones(r.prompt_ids.numel() + r.length), torch.zeros(right)]
                )
            )
        input_ids = torch.stack(rows).to(self.model.device)
        attention = torch.stack(masks).long().to(self.model.device)
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)  # left padding must not shift positions
        hidden = self.decoder(
            input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        # Positions prompt_len-1 .. end-1 predict the response tokens.
        return hidden[:, prompt_len - 1 : prompt_len - 1 + response_len]

    def correction(
        self, rollouts: list[Rollout]
    ) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[str, float]]:
        """Per rollout (by id): rollout-correction weights and the mask of tokens that carry loss, (T,) each;
        computed over the whole training batch (as verl does) for the rollouts that carry the sampler's
        log-probs, ones for the others. Metrics `rollout_corr/*` when any rollout is corrected."""
        result = {id(r): (torch.ones(r.length), r.mask) for r in rollouts}
        corrected = [r for r in rollouts if r.rollout_log_prob is not None]
        if not corrected:
            return result, {}
        config = self.config
        old = padded([r.old_log_prob for r in corrected], "cpu")
        sampled = padded([r.rollout_log_prob for r in corrected], "cpu")
        mask = padded([r.mask for r in corrected], "cpu")
        weights, kept, metrics = rollout_correction(
            old,
            sampled,
            mask,
            config.rollout_is,
            config.rollout_is_threshold,
            config.rollout_is_batch_normalize,
            config.rollout_rs,
            config.rollout_rs_threshold,
        )
        weights = mask if weights is None else weights
        result.update(
            {
                id(r): (weights[row, : r.length], kept[row, : r.length] * r.mask)
                for row, r in enumerate(corrected)
            }
        )
        return result, metrics

    def update(self, groups: list[list[Rollout]]) -> dict[str, float]:
        """Mini-batch updates over the kept groups; metrics averaged over response tokens."""
        config = self.config
        totals: dict[str, float] = {}
        token_count, grad_norms, trained_tokens, skipped = 0.0, [], 0, 0
        hyperparameters = config.loss
        # Overlong filtering: truncated responses carry no loss, so they are not even run forward.
        trained = [
            [r for r in group if r.length and not (config.overlong_filter and r.truncated)]
            for group in groups
        ]
        correction, correction_metrics = self.correction([r for group in trained for r in group])
        self.model.train()
        for _ in range(config.ppo_epochs):
            for start in range(0, len(trained), config.mini_batch_size):
                mini = [r for group in trained[start : start + config.mini_batch_size] for r in group]
                loss_tokens = sum(float(correction[id(r)][1].sum()) for r in mini)
                loss_sequences = sum(bool(correction[id(r)][1].any()) for r in mini)
                if loss_tokens == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                for micro_start in range(0, len(mini), config.micro_batch_size):
                    micro = mini[micro_start : micro_start + config.micro_batch_size]
                    log_prob, entropy, mask = self.forward_log_probs(micro)
                    old = padded([r.old_log_prob for r in micro], log_prob.device)
                    weights = padded([correction[id(r)][0] for r in micro], log_prob.device)
                    mask = mask * padded([correction[id(r)][1] for r in micro], log_prob.device)
                    advantages = torch.tensor([r.advantage for r in micro], device=log_prob.device)
                    loss, metrics = policy_loss(
                        log_prob,
                        old,
                        advantages,
                        mask,
                        hyperparameters,
                        num_global_tokens=loss_tokens,
                        num_global_sequences=loss_sequences,
                        rollout_is_weights=weights if correction_metrics else None,
                    )
                    loss.backward()
                    micro_tokens = float(mask.sum())
                    metrics["actor/entropy"] = float((entropy * mask).sum() / max(micro_tokens, 1))
                    metrics["actor/pg_loss"] = loss.item() * loss_tokens / max(micro_tokens, 1)
                    for key, value in metrics.items():
                        totals[key] = totals.get(key, 0.0) + value * micro_tokens
                    token_count += micro_tokens
                    trained_tokens += forward_tokens(micro, shared=self.shares_prompts)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable, config.grad_clip))
                # No gradient (every advantage zero), no step: AdamW would still move the weights through its
                # moments and weight decay, and the scheduler would count an update that did not happen.
                if grad_norm == 0.0:
                    skipped += 1
                    continue
                grad_norms.append(grad_norm)
                self.optimizer.step()
                self.scheduler.step()
        metrics = {key: value / max(token_count, 1) for key, value in totals.items()} | correction_metrics
        metrics["actor/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        metrics["actor/updates"] = len(grad_norms)
        metrics["actor/updates_skipped"] = skipped
        metrics["perf/trained_tokens"] = trained_tokens
        return metrics
