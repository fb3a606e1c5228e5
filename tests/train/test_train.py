"""The embedded trainer end to end on the real embedded model, at a size that runs in seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from toy import TINY, run_train

from dapo_suite.train.rollout import Rollout, sample_rollouts
from dapo_suite.train.trainer import filter_groups


def rollout(group: int, acc: bool, reward: float | None = None) -> Rollout:
    return Rollout(
        group=group,
        prompt_ids=torch.tensor([1, 2]),
        response_ids=torch.tensor([3]),
        old_log_prob=torch.tensor([-0.5]),
        truncated=False,
        text="",
        acc=acc,
        reward=reward if reward is not None else (1.0 if acc else -1.0),
    )


def test_dynamic_sampling_keeps_only_mixed_groups_and_counts_the_rest():
    groups = [
        [rollout(0, True), rollout(0, True)],
        [rollout(1, False), rollout(1, False)],
        [rollout(2, True), rollout(2, False)],
    ]
    kept, counts = filter_groups(groups, dynamic_sampling=True, metric="acc")
    assert [g[0].group for g in kept] == [2]
    assert counts == {"all_correct": 1, "all_wrong": 1, "mixed": 1, "zero_advantage": 2}
    kept, _ = filter_groups(groups, dynamic_sampling=False, metric="acc")
    assert len(kept) == 3


def test_filtering_on_the_shaped_reward_keeps_groups_the_length_penalty_splits():
    # All wrong, but one response is also too long: same accuracy, different reward (NeMo-RL #2431's trap).
    group = [rollout(0, False, reward=-1.0), rollout(0, False, reward=-1.5)]
    assert filter_groups([group], True, "acc")[0] == []
    assert filter_groups([group], True, "reward")[0] == [group]
    # All wrong, yet not zero-advantage: the penalty gives the group a gradient.
    assert filter_groups([group], True, "acc")[1] == {
        "all_correct": 0,
        "all_wrong": 1,
        "mixed": 0,
        "zero_advantage": 0,
    }


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    from dapo_suite.inference.sampling import sample_top_p

    log_probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(4000, 1)
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample_top_p(log_probs, 0.7, generator), minlength=4)
    assert counts[2:].sum() == 0  # 0.5 + 0.3 reaches 0.7: the tail is never drawn
    assert abs(counts[0] / 4000 - 0.5 / 0.8) < 0.03
    assert sample_top_p(log_probs[:3], 0.1, generator).tolist() == [0, 0, 0]


def test_grouped_query_attention_equals_transformers_sdpa(embedded_model_dir):
    """The attention that skips repeating K/V per query head gives sdpa's logits and gradients, in a padded
    prefill and in a KV-cached decode step."""
    from dapo_suite.inference.models import GROUPED_SDPA, load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(embedded_model_dir))
    assert model.config._attn_implementation == GROUPED_SDPA
    ids = torch.randint(100, 5000, (4, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:2, :9] = 0  # left padding
    results = {}
    for implementation in ("sdpa", GROUPED_SDPA):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        out.logits[mask[:, :-1].bool()].logsumexp(-1).sum().backward()
        with torch.no_grad():
            step = model(
                input_ids=ids[:, -1:],
                attention_mask=mask,
                past_key_values=out.past_key_values,
                position_ids=mask.sum(-1, keepdim=True) - 1,
            ).logits
        results[implementation] = (
            out.logits.detach()[mask[:, :-1].bool()],
            step,
            model.model.layers[5].self_attn.q_proj.weight.grad.clone(),
        )
    for reference, grouped in zip(results["sdpa"], results[GROUPED_SDPA], strict=True):
        torch.testing.assert_close(grouped, reference, atol=1e-4, rtol=1e-4)


def test_sampling_that_drops_finished_rows_matches_generate(embedded_model_dir):
    """Greedy decoding through `sample_tokens` (which cuts finished rows out of the KV cache) gives exactly
    the tokens of `model.generate`, for left-padded prompts of different lengths."""
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.inference.sampling import sample_tokens

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    model.eval()
    prompts = [
        "What is 2 + 3? Answer with a number.",
        "Say hi.",
        "Count from one to ten in words, then stop.",
        "What is the capital of France?",
        "Name a colour.",
        "Is 7 prime? Reply yes or no.",
    ]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampled = sample_tokens(
        model,
        encoded["input_ids"],
        encoded["attention_mask"],
        24,
        0.0,
        1.0,
        {tokenizer.eos_token_id},
        tokenizer.pad_token_id,
    )
    reference = model.generate(
        **encoded,
        do_sample=False,
        max_new_tokens=24,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )[:, encoded["input_ids"].shape[1] :]
    assert (
        sampled.stopped.any() and not sampled.stopped.all()
    )  # some rows are dropped early, some run to the limit
    for row in range(len(prompts)):
        length = int(sampled.lengths[row])
        assert sampled.tokens[row, :length].tolist() == reference[row, :length].tolist()
        assert bool(sampled.stopped[row]) == (
            sampled.tokens[row, length - 1].item() == tokenizer.eos_token_id
        )


def test_training_writes_metrics_checkpoints_and_plots(tmp_path):
    out = tmp_path / "run"
    result = run_train(out, "--max-steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/acc" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for key in (
        "reward/mean",
        "actor/entropy",
        "response_len/mean",
        "response_len/max",
        "response_len/clip_ratio",
        "actor/clipfrac_upper",
        "actor/clipfrac_lower",
        "actor/ppo_kl",
        "actor/grad_norm",
        "sampling/gen_batches",
        "sampling/groups_kept",
        "perf/rollout_tokens_per_s",
    ):
        assert key in steps[-1], key
    summary = json.loads((out / "summary.json").read_text())
    assert {"before", "after"} <= set(summary)
    checkpoint = out / "checkpoint-last"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "tokenizer.json").is_file()
    assert "im_start" in (checkpoint / "chat_template.jinja").read_text()
    assert list((out / "tensorboard").iterdir())
    png = out / "training_dynamics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert sum(p.numel() for p in reloaded.parameters()) > 100_000_000

    again = run_train(out, "--max-steps", "3")
    assert again.returncode != 0 and "--resume" in again.stderr


@pytest.mark.slow  # ~1 minute quiet, 4+ beside a training run (`make test` runs it with the slow tests)
def test_kill_mid_step_and_resume_loses_at_most_one_step_and_an_extension_is_evaluated_at_its_end(tmp_path):
    """A SIGKILL inside step 3 loses that step only: the resume redoes it and nothing before it. The finished
    run extended by one step is evaluated again: its summary's held-out "after" is the new last step's, not
    the one measured when it first finished."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "dapo_suite.cli", "train", "--out", str(out), *TINY, "--max-steps", "4"]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 600
    while not (out / "checkpoints" / "step-000002").is_dir():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint after 600 s"
        time.sleep(0.2)
    time.sleep(1.0)  # now inside step 3
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    steps_logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps_logged) <= 3

    resumed = run_train(out, "--max-steps", "4", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if "reward/acc" in r]
    assert train_steps == [1, 2, 3, 4]  # every step once: the killed step was redone, nothing lost before it
    state = torch.load(out / "checkpoint-last" / "trainer_state.pt", weights_only=False)
    assert (
        state["step"] == 4 and state["sampler_cursor"] == 8
    )  # 4 steps x 2 prompts, none skipped or repeated
    assert json.loads((out / "summary.json").read_text())["steps"] == 4

    extended = run_train(out, "--max-steps", "5", "--resume")
    assert extended.returncode == 0, extended.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    evaluated = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "val/acc" in line
    ]
    assert summary["steps"] == 5 and [r["step"] for r in evaluated] == [0, 4, 5]
    assert summary["after"]["acc"] == evaluated[-1]["val/acc"]


def test_gradient_checkpointing_trades_memory_for_time_not_maths(tmp_path):
    """Activations recomputed in the backward pass: far fewer tensors kept for it, the same gradients."""
    plain = _tiny_trainer(tmp_path / "plain")
    recomputed = _tiny_trainer(tmp_path / "recomputed", gradient_checkpointing=True)
    problems = plain.sampler.next(2)
    torch.manual_seed(0)
    rollouts = sample_rollouts(
        plain.engine, plain.tokenizer, [plain.prompt_text(p) for p in problems], 2, 8, 1.0, 1.0
    )
    kept, gradients = [], []
    for trainer in (plain, recomputed):
        trainer.model.train()
        kept.append(0)

        def count(tensor: torch.Tensor) -> torch.Tensor:
            kept[-1] += tensor.numel()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
            log_prob, _, mask = trainer.actor.forward_log_probs(rollouts)
        (log_prob * mask).sum().backward()
        gradients.append([p.grad for p in trainer.model.parameters()])
    assert kept[1] < kept[0] / 2, kept
    # The checkpointed forward runs every row whole (no shared prompt): equal up to float32 summation order.
    drift = [
        float((got - expected).norm() / expected.norm()) for expected, got in zip(*gradients, strict=True)
    ]
    assert max(drift) < 1e-3, max(drift)


def test_rollout_log_probs_equal_a_full_forward_pass(embedded_model_dir):
    # Sampling reuses one prompt's KV cache for its G copies and records log pi_old on the way: both must
    # agree with scoring the finished sequences from scratch, padded prompts included.
    from dapo_suite.core.prompts import chat_messages
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.train.algorithm import token_log_probs
    from dapo_suite.train.rollout import hf_engine, sample_rollouts

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    prompts = [
        tokenizer.apply_chat_template(chat_messages(q), tokenize=False, add_generation_prompt=True)
        for q in ("What is 7 + 5?", "What is 12 - 3? Explain every step carefully before answering.")
    ]
    torch.manual_seed(0)
    config = SimpleNamespace(sampling_dtype=None, rollout_quantization=None, rollout_kv_cache_dtype="auto")
    rollouts = sample_rollouts(
        hf_engine(config, model, tokenizer), tokenizer, prompts, group_size=3, max_new_tokens=12
    )
    assert [r.group for r in rollouts] == [0, 0, 0, 1, 1, 1]
    assert len({tuple(r.response_ids.tolist()) for r in rollouts}) > 1  # sampled, not copied
    for r in rollouts:
        sequence = torch.cat([r.prompt_ids, r.response_ids]).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[:, r.prompt_ids.numel() - 1 : -1]
        expected = token_log_probs(logits.float(), r.response_ids.unsqueeze(0))[0]
        torch.testing.assert_close(r.old_log_prob, expected, atol=2e-4, rtol=0)


def test_rollouts_end_at_the_chat_models_end_of_turn(embedded_model_dir):
    # The embedded tokenizer's own eos is <|im_start|>; a response must stop at <|im_end|> (the generation
    # config's eos), not run on past it.
    from dapo_suite.core.prompts import chat_messages
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.train.rollout import hf_engine, sample_rollouts

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [
        tokenizer.apply_chat_template(chat_messages(q), tokenize=False, add_generation_prompt=True)
        for q in ("What is 7 + 5?", "Say hi.")
    ]
    torch.manual_seed(0)
    rollouts = sample_rollouts(
        hf_engine(
            SimpleNamespace(sampling_dtype=None, rollout_quantization=None, rollout_kv_cache_dtype="auto"),
            model,
            tokenizer,
        ),
        tokenizer,
        prompts,
        group_size=8,
        max_new_tokens=128,
    )  # 16 samples: some end on any CPU
    stopped = [r for r in rollouts if not r.truncated]
    assert stopped, "no response ended within 128 tokens"
    assert all(r.response_ids[-1] == end_of_turn for r in stopped)
    assert all(end_of_turn not in r.response_ids[:-1].tolist() for r in rollouts)


def _tiny_trainer(out: Path, **overrides):
    from dapo_suite.train.config import resolve_config
    from dapo_suite.train.trainer import DAPOTrainer

    values = {
        "out": str(out),
        "heldout_size": 2,
        "group_size": 2,
        "gen_batch_size": 2,
        "train_batch_size": 2,
        "mini_batch_size": 1,
        "micro_batch_size": 3,
        "max_response_length": 8,
        "overlong_buffer_len": 4,
    }
    # float32 throughout unless a test asks otherwise (tiny-cpu's `auto` would pick bf16 on an AVX-512 BF16
    # CPU).
    return DAPOTrainer(
        resolve_config(["dapo"], values, {"sampling_dtype": None, "autocast_dtype": None, **overrides})
    )


def test_trainer_recomputes_behaviour_log_probs_an_engine_does_not_return(tmp_path):
    # vLLM returns no log pi_old (its kernels differ from the trainer's); the trainer scores the samples
    # itself, in micro-batches, and must get what the sampler recorded.
    trainer = _tiny_trainer(tmp_path / "run", temperature=0.7)  # pi_old is of the temperature-scaled policy
    problems = trainer.sampler.next(2)
    torch.manual_seed(0)
    rollouts = sample_rollouts(
        trainer.engine, trainer.tokenizer, [trainer.prompt_text(p) for p in problems], 3, 8, 0.7, 1.0
    )
    recorded = [r.old_log_prob for r in rollouts]
    for r in rollouts:
        r.old_log_prob = None
    trainer.model.train()
    trainer.fill_old_log_probs(rollouts)
    assert trainer.model.training  # left as it was found
    for r, expected in zip(rollouts, recorded, strict=True):
        torch.testing.assert_close(r.old_log_prob, expected, atol=2e-4, rtol=0)


def test_autocast_computes_log_probs_in_bf16_and_keeps_weights_and_gradients_in_f32(tmp_path):
    """autocast_dtype=bfloat16: the forward runs in bf16 (log-probs close to f32's but not equal), while the
    parameters and their gradients stay float32 (AdamW keeps f32 state)."""
    f32 = _tiny_trainer(tmp_path / "f32")
    mixed = _tiny_trainer(tmp_path / "bf16", autocast_dtype="bfloat16")
    problems = f32.sampler.next(2)
    torch.manual_seed(0)
    rollouts = sample_rollouts(
        f32.engine, f32.tokenizer, [f32.prompt_text(p) for p in problems], 2, 8, 1.0, 1.0
    )
    with torch.no_grad():
        exact, _, mask = f32.actor.forward_log_probs(rollouts)
    approx, _, _ = mixed.actor.forward_log_probs(rollouts)
    difference = ((approx.detach() - exact).abs() * mask).max()
    assert 0 < difference < 0.5, difference
    (approx * mask).sum().backward()
    parameters = list(mixed.model.parameters())
    assert all(
        p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32) for p in parameters
    )
    assert any(p.grad is not None for p in parameters)


def test_rollout_engine_choice_on_a_machine_without_vllm_or_gpu(tmp_path):
    import importlib.util

    from dapo_suite.inference.engines import HFEngine
    from dapo_suite.inference.models import vllm_usable

    if vllm_usable():
        pytest.skip("vLLM and a GPU are here: test_vllm_rollout_follows_the_policy covers this machine")
    assert isinstance(_tiny_trainer(tmp_path / "auto").engine, HFEngine)
    with pytest.raises(RuntimeError) as error:
        _tiny_trainer(tmp_path / "vllm", rollout_engine="vllm")
    expected = (
        "pip install 'dapo-suite[gpu]'" if importlib.util.find_spec("vllm") is None else "needs a CUDA GPU"
    )
    assert expected in str(error.value) and "rollout_engine=hf" in str(error.value)
    result = run_train(
        tmp_path / "cli", "--set", "rollout_engine=vllm"
    )  # the CLI says it, without a traceback
    assert result.returncode != 0 and expected in result.stderr and "Traceback" not in result.stderr


def test_vllm_rollout_follows_the_policy(tmp_path):
    """GPU machines with vLLM only: after each update vLLM samples from the trainer's weights."""
    from dapo_suite.inference.models import vllm_usable

    if not vllm_usable():
        pytest.skip("needs vLLM and a CUDA GPU (pip install 'dapo-suite[gpu]' on a GPU machine)")
    from dapo_suite.inference.engines import VLLMEngine

    trainer = _tiny_trainer(
        tmp_path / "run",
        rollout_engine="vllm",
        dtype="bfloat16",
        lr=1e-3,
        warmup_steps=0,
        max_steps=2,
        rollout_gpu_memory_utilization=0.2,
    )
    assert isinstance(trainer.engine, VLLMEngine)

    def vllm_embeddings() -> torch.Tensor:
        model = trainer.engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
        return model.model.embed_tokens.weight.detach().float().cpu().clone()

    before = vllm_embeddings()
    trainer.fit(progress=False)
    after = vllm_embeddings()
    policy = trainer.model.model.embed_tokens.weight.detach().float().cpu()
    assert not torch.equal(before, after)  # the updates reached vLLM
    torch.testing.assert_close(after, policy)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("actor/pg_loss" in m for m in metrics)


def test_the_same_seed_repeats_a_run_bit_for_bit_and_another_seed_does_not(tmp_path):
    """Same seed, machine and thread count: the same metrics (timings aside) and the same weights, bit for
    bit, over two steps (the second samples from the first's update), the second time beside a busy process
    (rewards bounded by work, not by the clock); another seed's first step differs. Without held-out
    evaluation (`heldout_eval=false`: no before/after, no verdict), as a smoke run trains."""
    import hashlib
    import shutil

    from safetensors.torch import load_file

    def run(name: str, seed: int, steps: int = 2, busy: bool = False) -> tuple[list[dict], dict]:
        """The run's metrics and a digest of each final weight; its folder is then removed (a checkpoint: 1.6
        GB)."""
        out = tmp_path / name
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            result = run_train(
                out,
                "--max-steps",
                str(steps),
                "--seed",
                str(seed),
                "--set",
                "heldout_eval=false",
                "--set",
                "keep_checkpoints=1",
            )
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        assert result.returncode == 0, result.stderr[-3000:]
        assert "verdict" not in result.stdout and "before" not in json.loads(
            (out / "summary.json").read_text()
        )
        timed = ("time", "perf/", "seconds", "per_s")
        metrics = [
            {k: v for k, v in json.loads(line).items() if not any(t in k for t in timed)}
            for line in (out / "metrics.jsonl").read_text().splitlines()
        ]
        assert not any(key.startswith("val/") for record in metrics for key in record)
        weights = {
            name: hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()
            for name, tensor in load_file(out / "checkpoint-last" / "model.safetensors").items()
        }
        shutil.rmtree(out)
        return metrics, weights

    first, weights = run("a", 3)
    again, weights_again = run("b", 3, busy=True)
    assert first == again
    assert weights == weights_again
    other, _ = run("c", 4, steps=1)
    assert other[0] != first[0]


def test_rows_sharing_a_prompt_run_it_once_with_each_rows_own_log_probs_and_gradients(tmp_path):
    """The update runs a group's prompt once and repeats its keys and values for every response: log-probs and
    gradients equal those of each row run whole and alone, in fewer tokens."""
    from dapo_suite.train.actor import forward_tokens

    trainer = _tiny_trainer(tmp_path / "run")
    problems = trainer.sampler.next(2)
    torch.manual_seed(0)
    rollouts = sample_rollouts(
        trainer.engine, trainer.tokenizer, [trainer.prompt_text(p) for p in problems], 3, 8, 1.0, 1.0
    )
    for index, r in enumerate(rollouts):  # lengths 8, 7, 6, ...: right padding is exercised
        r.response_ids = r.response_ids[: 8 - index]
    trainer.model.train()
    log_prob, _, mask = trainer.actor.forward_log_probs(rollouts)
    (log_prob * mask).sum().backward()
    shared = [p.grad.clone() for p in trainer.actor.trainable]
    trainer.model.zero_grad()
    for row, r in enumerate(rollouts):  # the reference: one row at a time, no padding, no cache
        ids = torch.cat([r.prompt_ids, r.response_ids])[None]
        logits = trainer.model(input_ids=ids, use_cache=False).logits[0, r.prompt_ids.numel() - 1 : -1]
        alone = torch.log_softmax(logits.float(), -1).gather(-1, r.response_ids[:, None])[:, 0]
        torch.testing.assert_close(log_prob[row, : r.length].detach(), alone.detach(), atol=1e-4, rtol=0)
        assert mask[row].sum() == r.length
        alone.sum().backward()
    drift = [
        float((got - p.grad).norm() / p.grad.norm())
        for got, p in zip(shared, trainer.actor.trainable, strict=True)
    ]
    assert max(drift) < 1e-3, max(
        drift
    )  # float32 summation order: every row whole and padded drifts 2e-4 too
    groups = [rollouts[:3], rollouts[3:]]
    assert forward_tokens(rollouts, shared=True) == (
        sum(g[0].prompt_ids.numel() for g in groups) + sum(r.length for r in rollouts)
    )


def test_int8_rollouts_turn_rollout_correction_on_and_report_the_mismatch(tmp_path):
    """`rollout_quantization: int8` samples from an int8 copy of the weights while the trainer keeps float32:
    the auto correction is on, the sampler's log-probs are kept as pi_rollout beside the trainer's recomputed
    pi_old, and the correction's metrics say how far apart they are (near, not equal)."""
    trainer = _tiny_trainer(tmp_path / "run", rollout_quantization="int8")
    assert trainer.corrects_rollouts()
    assert trainer.model.dtype == torch.float32 and trainer.engine.sampling_dtype == torch.float32
    problems = trainer.sampler.next(2)
    torch.manual_seed(0)
    rollouts = sample_rollouts(
        trainer.engine, trainer.tokenizer, [trainer.prompt_text(p) for p in problems], 3, 8, 1.0, 1.0
    )
    # the sampler's copy: int8, stored unsigned (q + 128) where the integer dot products take it
    assert trainer.engine._stepper_weights().lm_head.weight.dtype in (torch.int8, torch.uint8)
    trainer.fill_old_log_probs(rollouts)
    assert all(r.rollout_log_prob is not None and r.old_log_prob is not None for r in rollouts)
    _, metrics = trainer.actor.correction(rollouts)
    assert 0 < metrics["rollout_corr/k3_kl"] < 0.05, metrics
    assert 0 < metrics["rollout_corr/is_weight_mean"] < 2


def test_rollout_kv_cache_dtype_reaches_the_samplers_cache(embedded_model_dir):
    """`rollout_kv_cache_dtype: bfloat16` under float32 sampling: the trainer's engine keeps the KV cache in
    bf16 (where the fused kernels run; elsewhere it warns and keeps float32)."""
    from dapo_suite.inference.fused_step import kernels
    from dapo_suite.inference.models import load_model_and_tokenizer
    from dapo_suite.train.rollout import hf_engine

    if kernels() is None:
        pytest.skip("the fused kernels could not be built here: the cache keeps the activations' dtype")
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    for quantization in (None, "int8"):
        config = SimpleNamespace(
            sampling_dtype="float32", rollout_quantization=quantization, rollout_kv_cache_dtype="bfloat16"
        )
        weights = hf_engine(config, model, tokenizer)._stepper_weights()
        assert weights.dtype == torch.float32 and weights.kv_dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rollout_quantization": "int3"}, "rollout_quantization 'int3' is not one of int8"),
        ({"rollout_quantization": "int8", "rollout_engine": "vllm"}, "quantizes the embedded trainer's"),
        ({"rollout_kv_cache_dtype": "fp8"}, "rollout_kv_cache_dtype 'fp8' is not one of auto, bfloat16"),
        (
            {"rollout_kv_cache_dtype": "bfloat16", "rollout_engine": "vllm"},
            "vLLM takes its own kv_cache_dtype",
        ),
    ],
)
def test_a_rollout_quantization_that_cannot_run_is_refused_with_what_to_set(settings, message):
    from dapo_suite.core.errors import UserError
    from dapo_suite.train.config import resolve_config

    with pytest.raises(UserError, match=message):
        resolve_config(["dapo"], {}, settings)
