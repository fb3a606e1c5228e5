"""`dapo-suite train export`: a real verl FSDP checkpoint (saved by verl's FSDPCheckpointManager on CPU, gloo,
world size 1, FSDP2) merged by verl's model merger into a directory transformers loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dapo_suite.core.ports import free_port


def _save_verl_checkpoint(run_dir: Path, tokenizer_dir: Path) -> dict[str, torch.Tensor]:
    """A tiny Llama (the embedded model's architecture, 2 layers, random) sharded with FSDP2 and saved the way
    verl's actor worker does: RUN_DIR/checkpoints/global_step_1/actor + latest_checkpointed_iteration.txt."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from verl.trainer.config import CheckpointConfig
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        config = AutoConfig.from_pretrained(tokenizer_dir)
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 64, 128
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        manager = FSDPCheckpointManager(
            model=model,
            optimizer=optimizer,
            lr_scheduler=None,
            processing_class=AutoTokenizer.from_pretrained(tokenizer_dir),
            checkpoint_config=CheckpointConfig(save_contents=["model", "optimizer", "extra"]),
        )
        root = run_dir / "checkpoints"
        manager.save_checkpoint(str(root / "global_step_1" / "actor"), global_step=1)
        (root / "latest_checkpointed_iteration.txt").write_text("1")
    finally:
        dist.destroy_process_group()
    return reference


@pytest.mark.timeout(600)
def test_export_merges_a_verl_fsdp_checkpoint_into_a_loadable_hf_dir(tmp_path, embedded_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_suite.train.cli import train

    reference = _save_verl_checkpoint(tmp_path / "run", embedded_model_dir)
    actor = tmp_path / "run" / "checkpoints" / "global_step_1" / "actor"
    assert (actor / "model_world_size_1_rank_0.pt").is_file() and (actor / "fsdp_config.json").is_file()

    result = CliRunner().invoke(train, ["export", str(tmp_path / "run")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    target = tmp_path / "run" / "hf-export"
    assert result.output.strip().splitlines()[-1] == str(target)

    model = AutoModelForCausalLM.from_pretrained(target)
    AutoTokenizer.from_pretrained(target)
    merged = model.state_dict()
    for name, tensor in reference.items():
        # the merger stores bfloat16, and the command says so
        torch.testing.assert_close(merged[name].float(), tensor.to(torch.bfloat16).float())
    assert "in BF16" in result.output and "writes bfloat16" in result.output
    record = json.loads((target / "dapo_suite_export.json").read_text())
    assert set(record["dtypes"]) == {"BF16"} and record["source"] == str(actor) and record["step"] == 1


def test_export_without_checkpoint_says_what_is_missing(tmp_path):
    from dapo_suite.train.cli import train

    result = CliRunner().invoke(train, ["export", str(tmp_path)])
    assert result.exit_code != 0
    assert "no verl checkpoint under" in result.output
