"""LoRA in the embedded trainer (`lora_rank` > 0): low-rank adapters on a frozen base, through PEFT.

W x becomes W x + (lora_alpha / r) B A x on every targeted linear layer (A: r x in, B: out x r, B starts at
zero so step 0 is the base model). Only A and B carry gradients and AdamW state; the trainer keeps calling the
transformers module (PEFT injects its layers into it) and the sampler's snapshot merges the adapters
(`dapo_suite.inference.models.merged_weight`). A checkpoint holds the adapter folder (PEFT's
`adapter_config.json` + `adapter_model.safetensors`), which eval and serve load over its base model.
"""

from __future__ import annotations

from dapo_suite.core.errors import UserError
from dapo_suite.train.config import TrainConfig

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's file name in an adapter folder


def add_adapters(model, config: TrainConfig):
    """Inject LoRA layers (rank `lora_rank`, scale `lora_alpha / lora_rank`, on `lora_targets`) into `model`,
    freezing everything else; returns the PEFT wrapper, which saves and loads the adapters. A's initial values
    come from torch's global generator, so a run's seed fixes them."""
    from peft import LoraConfig, get_peft_model

    settings = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=config.lora_target_list,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, settings)
    except ValueError as error:  # PEFT's message for targets the model does not have
        raise UserError(f"lora_targets={config.lora_targets}: {error}") from None


def adapter_state(adapters) -> dict:
    """The adapters' tensors under the names an adapter file stores them."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(adapters)


def load_adapter_state(adapters, weights: dict) -> None:
    """Copy an adapter file's tensors into the adapters; every adapter tensor must be in it and nothing
    else."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(adapters, weights)
    missing = [key for key in result.missing_keys if "lora_" in key]
    if result.unexpected_keys or missing:
        raise RuntimeError(
            f"the adapter file does not match the adapters: missing {missing[:3]}, unexpected "
            f"{result.unexpected_keys[:3]}"
        )
