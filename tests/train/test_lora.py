"""LoRA in the embedded trainer: adapters train on a frozen base, checkpoints hold the adapter folder and
resume exactly, export merges, eval loads both, and the sampler samples from the merged weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

# TINY's settings (tests/train/test_train.py): 2 prompts x 2 responses of at most 8 tokens; +token-loss
# without dynamic sampling, so the soft overlong penalty gives all-wrong groups an advantage and every step
# updates.
TINY_VALUES = {
    "heldout_size": 2,
    "val_n": 1,
    "group_size": 2,
    "gen_batch_size": 2,
    "train_batch_size": 2,
    "mini_batch_size": 1,
    "micro_batch_size": 4,
    "max_response_length": 8,
    "overlong_buffer_len": 4,
    "val_max_response_length": 8,
    "overlong_filter": False,
}
LORA = {"lora_rank": 16, "lora_alpha": 32.0, "lora_targets": "all-linear"}


def lora_trainer(out: Path, resume: bool = False, **overrides):
    from dapo_suite.train.config import resolve_config
    from dapo_suite.train.trainer import DAPOTrainer

    # float32 throughout (tiny-cpu's `auto` would pick a bf16 base and bf16 sampling on a CPU with native
    # bf16, whose rounding differs between AMX and AVX-512 BF16): the comparisons below are exact
    config = resolve_config(
        ["+token-loss"],
        {"out": str(out), **TINY_VALUES, **LORA},
        {"dtype": "float32", "sampling_dtype": None, "autocast_dtype": None, **overrides},
    )
    return DAPOTrainer(config, resume=resume)


def split_parameters(model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base, adapters): copies of the frozen and the trainable parameters, by name."""
    base = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    adapters = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    return base, adapters


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """Two LoRA steps and a checkpoint; the parameters before and after. Each step is the trainer's rollout
    and update, with opposite advantages in each group: at 8 tokens every response is truncated, so the
    rewards (and the trainer's own advantages) are equal, and the update would have no gradient."""
    out = tmp_path_factory.mktemp("lora") / "run"
    trainer = lora_trainer(out)
    before = split_parameters(trainer.model)
    metrics = []
    for _ in range(2):
        groups, _ = trainer.collect()
        for group in groups:
            for index, rollout in enumerate(group):
                rollout.advantage = 1.0 if index % 2 else -1.0
        metrics.append(trainer.actor.update(groups))
        trainer.engine.sync_weights()
        trainer.step_index += 1
    trainer.save()
    return {
        "out": out,
        "trainer": trainer,
        "before": before,
        "after": split_parameters(trainer.model),
        "metrics": metrics,
    }


@pytest.mark.slow  # two training steps: ~1 minute quiet, 2+ beside a training run
def test_lora_trains_only_the_adapters(lora_run):
    (base_before, adapters_before), (base_after, adapters_after) = lora_run["before"], lora_run["after"]
    assert adapters_before and all(".lora_A." in name or ".lora_B." in name for name in adapters_before)
    assert len(adapters_before) == 2 * 7 * 30  # A and B on the 7 linear layers of 30 blocks (all-linear)
    assert all(torch.equal(base_before[name], base_after[name]) for name in base_before)  # bit for bit
    assert all(m["actor/grad_norm"] > 0 for m in lora_run["metrics"])
    assert any(
        not torch.equal(adapters_before[name], adapters_after[name])
        for name in adapters_before
        if ".lora_B." in name
    )  # B starts at zero: it learned
    trainer = lora_run["trainer"]
    state = trainer.actor.optimizer.state_dict()["state"]
    assert len(state) == len(adapters_before) == len(trainer.actor.trainable)
    assert {id(p) for group in trainer.actor.optimizer.param_groups for p in group["params"]} == {
        id(p) for p in trainer.actor.trainable
    }
    assert all(p.requires_grad for p in trainer.actor.trainable)
    checkpoint = lora_run["out"] / "checkpoint-last"
    assert (checkpoint / "adapter_config.json").is_file() and (
        checkpoint / "adapter_model.safetensors"
    ).is_file()
    assert not (checkpoint / "model.safetensors").exists()  # the adapters only: the base is not copied


@pytest.mark.slow
def test_lora_resume_restores_adapters_and_optimizer_exactly_and_continues(lora_run):
    trained = lora_run["trainer"]
    resumed = lora_trainer(lora_run["out"], resume=True)
    assert resumed.step_index == 2
    own = dict(resumed.model.named_parameters())
    assert all(torch.equal(own[name], tensor) for name, tensor in lora_run["after"][1].items())
    expected, got = trained.actor.optimizer.state_dict(), resumed.actor.optimizer.state_dict()
    assert expected["state"].keys() == got["state"].keys()
    for index, slot in expected["state"].items():
        assert all(torch.equal(slot[key], got["state"][index][key]) for key in slot)
    resumed.step()
    assert resumed.step_index == 3


@pytest.mark.slow
def test_export_merges_the_adapters_and_eval_loads_export_and_adapter_folder(lora_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dapo_suite.cli import main

    out = lora_run["out"]
    result = CliRunner().invoke(main, ["train", "export", str(out)])
    assert result.exit_code == 0, result.output
    export = out / "hf-export"
    assert (export / "model.safetensors").is_file() and (export / "tokenizer.json").is_file()
    checkpoint = out / "checkpoint-last"
    merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(lora_run["trainer"].model.name_or_path, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, checkpoint)
    ids = torch.randint(100, 5000, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exported, unmerged = merged(input_ids=ids).logits, peft_model(input_ids=ids).logits
        # W x + s B (A x) against (W + s B A) x, summed in another order through 30 blocks: logits of
        # magnitude ~20 differed by up to 9e-5 in float32
        torch.testing.assert_close(exported, unmerged, atol=2e-4, rtol=1e-5)
        # and the exported weights are PEFT's own merge, bit for bit
        in_memory = peft_model.merge_and_unload()
        assert all(
            torch.equal(tensor, in_memory.state_dict()[name]) for name, tensor in merged.state_dict().items()
        )
        assert torch.equal(in_memory(input_ids=ids).logits, exported)
    for model in (export, checkpoint):  # in this process: a subprocess would load torch again
        evaluated = CliRunner().invoke(
            main,
            [
                "eval",
                "gsm8k",
                "--model",
                str(model),
                "--limit",
                "2",
                "--n",
                "1",
                "--max-tokens",
                "8",
                "--out",
                str(tmp_path / model.name),
            ],
        )
        assert evaluated.exit_code == 0, evaluated.output[-3000:]
        assert (tmp_path / model.name / "results.json").is_file()


def test_the_sampler_samples_from_the_merged_weights_after_sync(tmp_path):
    """Adapters far from zero (as after long training), `sync_weights`, then a greedy sample from the engine:
    the same tokens as the merged model's `generate`, and not the base model's."""
    from transformers import AutoModelForCausalLM

    from dapo_suite.inference.models import merge_adapters
    from dapo_suite.train.rollout import sample_rollouts

    trainer = lora_trainer(tmp_path / "run")
    prompt = trainer.prompt_text(trainer.heldout[0])

    def engine_greedy() -> list[int]:
        return sample_rollouts(trainer.engine, trainer.tokenizer, [prompt], 1, 24, temperature=0.0)[
            0
        ].response_ids.tolist()

    base_tokens = engine_greedy()  # the snapshot of the base (B = 0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trainer.actor.trainable:
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    trainer.engine.sync_weights()
    sampled = engine_greedy()
    trainer.save()
    merged_dir = merge_adapters(tmp_path / "run" / "checkpoint-last", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    inputs = trainer.tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    reference = merged.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=24,
        pad_token_id=trainer.tokenizer.pad_token_id,
        eos_token_id=sorted(trainer.engine.eos_ids),
    )[0, inputs["input_ids"].shape[1] :]
    assert sampled == reference.tolist()[: len(sampled)] and len(sampled) == len(reference)
    assert sampled != base_tokens


def test_same_seed_same_adapters_and_config_checks(tmp_path):
    from dapo_suite.core.errors import UserError
    from dapo_suite.train.config import resolve_config

    first, second = (split_parameters(lora_trainer(tmp_path / name).model)[1] for name in ("a", "b"))
    assert all(torch.equal(first[name], second[name]) for name in first)
    with pytest.raises(UserError, match="lora_rank=-1"):
        resolve_config([], {"lora_rank": -1})
    with pytest.raises(UserError, match="lora_alpha=0"):
        resolve_config([], {"lora_alpha": 0.0})
    assert resolve_config([], {"lora_targets": "q_proj, v_proj"}).lora_target_list == ["q_proj", "v_proj"]
    with pytest.raises(UserError, match="lora_targets"):
        lora_trainer(tmp_path / "c", lora_targets="no_such_proj")


@pytest.mark.slow  # one LoRA step
def test_a_bf16_base_stays_frozen_while_float32_adapters_learn(tmp_path):
    """dtype auto: a LoRA run's base in bf16 where bf16 is native (half the memory; it is only read), float32
    where it is not or where AdamW updates it; the adapters and their AdamW state float32 either way."""
    from dapo_suite.inference.models import native_bf16, weights_dtype

    assert weights_dtype("auto", True, "cpu") == ("bfloat16" if native_bf16("cpu") else "float32")
    assert (
        weights_dtype("auto", False, "cpu") == "float32"
        and weights_dtype("float16", True, "cpu") == "float16"
    )
    trainer = lora_trainer(tmp_path / "run", dtype="bfloat16", autocast_dtype="bfloat16")
    assert "dtype: bfloat16" in (tmp_path / "run" / "config.yaml").read_text()
    assert trainer.corrects_rollouts()  # the sampler's bf16 kernels round otherwise than the trainer's
    base, adapters = split_parameters(trainer.model)
    assert {p.dtype for p in base.values()} == {torch.bfloat16}
    assert {p.dtype for p in adapters.values()} == {torch.float32}
    groups, _ = trainer.collect()
    for group in groups:
        for index, rollout in enumerate(group):
            rollout.advantage = 1.0 if index % 2 else -1.0
    assert trainer.actor.update(groups)["actor/grad_norm"] > 0
    base_after, adapters_after = split_parameters(trainer.model)
    assert all(torch.equal(base[name], base_after[name]) for name in base)
    assert any(
        not torch.equal(adapters[name], adapters_after[name]) for name in adapters if ".lora_B." in name
    )
    assert all(
        s["exp_avg"].dtype == torch.float32 for s in trainer.actor.optimizer.state_dict()["state"].values()
    )
