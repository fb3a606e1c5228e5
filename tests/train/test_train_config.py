"""Training config and presets: defaults are the paper's run, the ladder differs only in switches."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import yaml

from dapo_suite.core.fields import field_types
from dapo_suite.train.config import (
    LADDER,
    RANGES,
    SWITCHES,
    TrainConfig,
    load_preset,
    parse_override,
    resolve_config,
)
from dapo_suite.train.loss_hyperparameters import LossHyperparameters


def test_dapo_preset_on_a_large_model_carries_the_papers_32b_settings():
    config = resolve_config(["dapo"], {"model": "Qwen/Qwen2.5-32B"})
    paper = {
        "clip_low": 0.2,
        "clip_high": 0.28,
        "clip_c": 10.0,
        "loss_agg": "token-mean",
        "max_prompt_length": 2048,
        "max_response_length": 20480,
        "overlong_penalty": True,
        "overlong_buffer_len": 4096,
        "overlong_penalty_factor": 1.0,
        "dynamic_sampling": True,
        "filter_metric": "acc",
        "max_num_gen_batches": 10,
        "train_batch_size": 512,
        "gen_batch_size": 1536,
        "group_size": 16,
        "mini_batch_size": 32,
        "lr": 1e-6,
        "warmup_steps": 10,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "val_temperature": 1.0,
        "val_top_p": 0.7,
        "val_n": 32,
    }
    assert {key: getattr(config, key) for key in paper} == paper
    assert config.updates_per_step == 16  # 512 prompts / 32 per mini-batch
    assert config.presets == ["dapo"]


def test_embedded_model_gets_the_tiny_cpu_scale_under_any_ladder_preset():
    config = resolve_config(["grpo"])
    assert config.presets == ["tiny-cpu", "grpo"]
    assert config.model == "embedded" and config.max_response_length == 64
    assert (
        config.clip_high == 0.2 and config.loss_agg == "seq-mean-token-mean" and not config.dynamic_sampling
    )


def test_ladder_presets_differ_only_in_switches_and_add_one_technique_each():
    rungs = [load_preset(name) for name in LADDER]
    for rung in rungs:
        assert set(rung) == set(SWITCHES)
    changed = [{k for k in SWITCHES if a[k] != b[k]} for a, b in zip(rungs, rungs[1:], strict=False)]
    assert changed == [
        {"overlong_filter"},
        {"clip_high"},
        {"overlong_penalty"},
        {"loss_agg"},
        {"dynamic_sampling"},
    ]


def test_overrides_win_and_are_typed():
    key, value = parse_override("clip_high=0.3")
    assert (key, value) == ("clip_high", 0.3)
    assert parse_override("clip-c=null") == ("clip_c", None)
    config = resolve_config(["dapo"], {"clip_high": 0.3, "group_size": 4})
    assert config.clip_high == 0.3 and config.group_size == 4


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("clip_hi=0.3", "unknown key 'clip_hi'"),
        ("nonsense", "expected key=value"),
    ],
)
def test_bad_overrides_name_the_problem(assignment, message):
    with pytest.raises(ValueError, match=message):
        parse_override(assignment)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"train_batch_size": 10, "mini_batch_size": 4}, "multiple of mini_batch_size"),
        ({"group_size": 1}, "group_size"),
        ({"loss_agg": "sample-mean"}, "loss_agg"),
        ({"clip_c": 0.5}, "clip_c"),
        ({"overlong_buffer_len": 30000}, "overlong_buffer_len"),
        ({"dtype": "bf16"}, "dtype 'bf16' must be auto, float32, bfloat16 or float16"),
        ({"tool_call_bonus": 0.1}, "tool_call_bonus rewards tool calls, which need multi_turn=true"),
        ({"multi_turn": True, "tool_format": "hermes"}, "set tool_format=python_block or --backend verl"),
        ({"tool_format": "json"}, "tool_format must be one of python_block, hermes"),
    ],
)
def test_impossible_configs_say_what_to_set(values, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**values)


def test_unknown_preset_lists_the_available_ones(tmp_path):
    with pytest.raises(ValueError, match="available: .*dapo"):
        resolve_config(["dapo-v2"])
    custom = tmp_path / "mine.yaml"
    custom.write_text(yaml.safe_dump({"clip_high": 0.35}))
    assert resolve_config([str(custom)]).clip_high == 0.35


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("lr=abc", "lr takes a float"),
        ("dynamic_sampling=maybe", "dynamic_sampling takes true/false"),
        ("group_size=2.5", "group_size takes an integer"),
        ("clip_c=big", "clip_c takes a float (or null)"),
    ],
)
def test_set_values_are_typed_against_the_field(assignment, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_override(assignment)


def test_set_values_of_the_right_type_are_converted():
    assert parse_override("lr=3e-5") == ("lr", 3e-5)  # YAML 1.1 would read "3e-5" as a string
    assert parse_override("dynamic_sampling=off") == ("dynamic_sampling", False)
    assert parse_override("group_size=8") == ("group_size", 8)
    assert parse_override("model=123") == ("model", "123")
    assert parse_override("val_max_response_length=null") == ("val_max_response_length", None)


def test_every_numeric_field_has_a_range():
    numeric = {
        name
        for name, hint in field_types(TrainConfig).items()
        if {int, float} & {hint, *typing.get_args(hint)} and hint is not bool
    }
    assert numeric - set(RANGES) == set()


@pytest.mark.parametrize("name", sorted(RANGES))
@pytest.mark.parametrize("bad", [float("nan"), -1e9])  # every range starts at 0 or above
def test_out_of_range_values_are_refused_naming_the_field(name, bad):
    with pytest.raises(ValueError, match=f"{name}="):
        resolve_config([], {name: bad})


def test_set_null_turns_off_what_a_preset_set_while_an_absent_flag_keeps_it():
    """`--set sampling_dtype=null` must beat tiny-cpu's `auto`; a flag not given (None) must not."""
    from dapo_suite.train.config import parse_override, resolve_config

    settings = dict([parse_override("sampling_dtype=null"), parse_override("autocast_dtype=null")])
    off = resolve_config(["dapo"], {"max_steps": None, "out": "runs/x"}, settings)
    assert off.sampling_dtype is None and off.autocast_dtype is None and off.max_steps == 12
    kept = resolve_config(["dapo"], {"max_steps": None, "sampling_dtype": None, "out": "runs/x"})
    assert kept.sampling_dtype == "auto" and kept.autocast_dtype == "auto"


def test_built_in_tasks_are_a_registry_of_disjoint_problem_sets():
    from dapo_suite.train.tasks import BUILTIN_TASKS, builtin_task

    sets = {
        name: {(problem.problem, problem.answer) for problem in make()}
        for name, make in BUILTIN_TASKS.items()
    }
    assert not {text for text, _ in sets["arithmetic"]} & {text for text, _ in sets["arithmetic-in-words"]}
    assert ("What is 3 plus 4?", "7") in sets["arithmetic-in-words"]
    assert ("What is 9 multiplied by 5?", "45") in sets["arithmetic-in-words"]
    train, heldout = builtin_task("arithmetic-in-words", 50, seed=0)
    assert len(heldout) == 50 and len(train) == len(sets["arithmetic-in-words"]) - 50
    with pytest.raises(ValueError, match="the built-in tasks are arithmetic, arithmetic-in-words"):
        builtin_task("geometry", 10, seed=0)


def test_the_docs_and_help_list_every_loss_knob_as_the_hyperparameters_define_it():
    from click.testing import CliRunner

    from dapo_suite.cli import main
    from dapo_suite.train.loss_hyperparameters import LOSS_KNOBS, loss_knobs_markdown

    docs = (Path(__file__).resolve().parents[2] / "docs" / "train.md").read_text()
    assert loss_knobs_markdown() in docs
    help_text = CliRunner().invoke(main, ["train", "--help"]).output
    assert all(f"  {name} = " in help_text for name in LOSS_KNOBS)
    # one default: TrainConfig's is the record's, and the config builds the record the loss receives
    config = TrainConfig()
    assert config.loss == LossHyperparameters()
    changed = TrainConfig(clip_high=0.5, loss_mode="gspo")
    assert (changed.loss.clip_high, changed.loss.loss_mode) == (0.5, "gspo")
