"""Model names as people write them, the shapes of the model families the docs list, and whether the Hugging
Face hub can be reached.

`Qwen2.5-32B` is what people call a model; `from_pretrained` and verl want its hub id, `Qwen/Qwen2.5-32B`.
`MODELS` is the registry of the families the docs list (Qwen2.5, Qwen3, Llama 3.x, the DAPO paper's models and
the embedded SmolLM2): every published name, its hub id, and the config.json fields that set its size, so the
size of a model is known before anything is downloaded. `hub_id` resolves a --model value once for every stage
and both training backends; `model_shape` reads those fields from a folder, the local cache or the registry;
`require_available` says at once, in one line, what to download when the hub cannot be reached.
"""

from __future__ import annotations

import difflib
import json
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from dapo_suite.core.errors import UserError

QWEN_VOCAB, QWEN_LARGE_VOCAB, LLAMA3_VOCAB = 151936, 152064, 128256
HUB_PROBE_SECONDS = 3.0  # a hub that has not accepted a connection by then counts as unreachable


def _shape(
    model_type: str,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    tied: bool,
    head_dim: int | None = None,
    **extra: int,
) -> dict:
    """The config.json fields that set a model's size, under config.json's own names."""
    fields = {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        **extra,
    }
    return {**fields, "head_dim": head_dim} if head_dim else fields


# The checkpoints' own config.json on the hub, by size.
QWEN25 = {
    "0.5B": _shape("qwen2", 896, 4864, 24, 14, 2, QWEN_VOCAB, True),
    "1.5B": _shape("qwen2", 1536, 8960, 28, 12, 2, QWEN_VOCAB, True),
    "3B": _shape("qwen2", 2048, 11008, 36, 16, 2, QWEN_VOCAB, True),
    "7B": _shape("qwen2", 3584, 18944, 28, 28, 4, QWEN_LARGE_VOCAB, False),
    "14B": _shape("qwen2", 5120, 13824, 48, 40, 8, QWEN_LARGE_VOCAB, False),
    "32B": _shape("qwen2", 5120, 27648, 64, 40, 8, QWEN_LARGE_VOCAB, False),
    "72B": _shape("qwen2", 8192, 29568, 80, 64, 8, QWEN_LARGE_VOCAB, False),
}
QWEN3 = {
    "0.6B": _shape("qwen3", 1024, 3072, 28, 16, 8, QWEN_VOCAB, True, 128),
    "1.7B": _shape("qwen3", 2048, 6144, 28, 16, 8, QWEN_VOCAB, True, 128),
    "4B": _shape("qwen3", 2560, 9728, 36, 32, 8, QWEN_VOCAB, True, 128),
    "8B": _shape("qwen3", 4096, 12288, 36, 32, 8, QWEN_VOCAB, False, 128),
    "14B": _shape("qwen3", 5120, 17408, 40, 40, 8, QWEN_VOCAB, False, 128),
    "32B": _shape("qwen3", 5120, 25600, 64, 64, 8, QWEN_VOCAB, False, 128),
    "30B-A3B": _shape(
        "qwen3_moe",
        2048,
        6144,
        48,
        32,
        4,
        QWEN_VOCAB,
        False,
        128,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
    ),
    "235B-A22B": _shape(
        "qwen3_moe",
        4096,
        12288,
        94,
        64,
        4,
        QWEN_VOCAB,
        False,
        128,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=1536,
    ),
}
QWEN3_BASE = ("0.6B", "1.7B", "4B", "8B", "14B", "30B-A3B")  # the sizes Qwen published a -Base of
LLAMA3 = {
    "8B": _shape("llama", 4096, 14336, 32, 32, 8, LLAMA3_VOCAB, False),
    "70B": _shape("llama", 8192, 28672, 80, 64, 8, LLAMA3_VOCAB, False),
    "405B": _shape("llama", 16384, 53248, 126, 128, 8, LLAMA3_VOCAB, False),
    "1B": _shape("llama", 2048, 8192, 16, 32, 8, LLAMA3_VOCAB, True, 64),
    "3B": _shape("llama", 3072, 8192, 28, 24, 8, LLAMA3_VOCAB, True, 128),
}
SMOLLM2_135M = _shape("llama", 576, 1536, 30, 9, 3, 49152, True)


def _family(
    owner: str,
    prefix: str,
    sizes: dict[str, dict],
    suffixes: tuple[str, ...],
    published: tuple[str, ...] | None = None,
    hub_prefix: str | None = None,
) -> dict[str, tuple[str, dict]]:
    """Short name -> (hub id, shape) for every size (or the `published` ones) of a family and every suffix."""
    return {
        f"{prefix}-{size}{suffix}": (f"{owner}/{hub_prefix or prefix}-{size}{suffix}", sizes[size])
        for size in (published or sizes)
        for suffix in suffixes
    }


# Short name -> (hub id, shape). A test checks every shape's parameter count against transformers' own model.
MODELS: dict[str, tuple[str, dict]] = {
    **_family("Qwen", "Qwen2.5", QWEN25, ("", "-Instruct")),
    **_family("Qwen", "Qwen3", QWEN3, ("",)),
    **_family("Qwen", "Qwen3", QWEN3, ("-Base",), QWEN3_BASE),
    **_family("meta-llama", "Llama-3", LLAMA3, ("", "-Instruct"), ("8B", "70B"), hub_prefix="Meta-Llama-3"),
    **_family("meta-llama", "Meta-Llama-3", LLAMA3, ("", "-Instruct"), ("8B", "70B")),
    **_family("meta-llama", "Llama-3.1", LLAMA3, ("", "-Instruct"), ("8B", "70B", "405B")),
    **_family("meta-llama", "Llama-3.2", LLAMA3, ("", "-Instruct"), ("1B", "3B")),
    **_family("meta-llama", "Llama-3.3", LLAMA3, ("-Instruct",), ("70B",)),
    # the DAPO paper's base model is Qwen2.5-32B (above); its trained model, and the R1 distillation it
    # compares to
    "DAPO-Qwen-32B": ("BytedTsinghua-SIA/DAPO-Qwen-32B", QWEN25["32B"]),
    "DeepSeek-R1-Distill-Qwen-32B": ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", QWEN25["32B"]),
    "SmolLM2-135M-Instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", SMOLLM2_135M),  # the embedded model
}
FAMILIES = "Qwen2.5-*, Qwen3-*, Llama-3.x-*, DAPO-Qwen-32B, DeepSeek-R1-Distill-Qwen-32B"
_BY_NAME = {name.lower(): entry for name, entry in MODELS.items()}
_BY_NAME.update({hub.lower(): (hub, shape) for hub, shape in MODELS.values()})


def looks_like_path(name: str) -> bool:
    """A --model value written as a path (./x, /x, ~/x, a/b/c): never a hub id or a short name."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def unknown_model_message(name: str) -> str:
    """What a --model value that is neither a folder, a hub id nor a known short name gets, on either
    backend."""
    close = difflib.get_close_matches(name, list(MODELS), n=1, cutoff=0.8)
    hint = f"; did you mean {close[0]}?" if close else ""
    return (
        f"model path {name!r} does not exist (give a local HF directory or a hub id like Qwen/Qwen2.5-32B; "
        f"short names resolve for {FAMILIES}{hint})"
    )


def registered_id(name: str) -> str | None:
    """The hub id of a short name of `MODELS` (any case), else None."""
    entry = _BY_NAME.get(name.lower()) if "/" not in name else None
    return entry[0] if entry else None


def hub_id(name: str) -> str:
    """A --model value that is not a folder here, as the hub knows it: a short name of `MODELS` -> its hub id,
    OWNER/NAME -> itself; anything else is a UserError (`unknown_model_message`)."""
    if (known := registered_id(name)) is not None:
        return known
    if "/" in name and not looks_like_path(name):
        return name
    raise UserError(unknown_model_message(name))


def model_shape(model: str) -> dict | None:
    """The config.json fields of `model` (a folder, an adapter folder's base, a hub id or short name): read
    from the folder or the local Hugging Face cache, else the registry's; None when none of them has it."""
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return json.loads((path / "config.json").read_text())
    if (path / "adapter_config.json").is_file():
        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        return model_shape(base) if base else None
    if path.exists() or looks_like_path(model):
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(hub_id(model), "config.json")
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text())
    entry = _BY_NAME.get(model.lower())
    return dict(entry[1]) if entry else None


def is_cached(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds `repo_id`'s config and weights (one file or a sharded
    index)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> bool:
        return isinstance(try_to_load_from_cache(repo_id, filename), str)

    return cached("config.json") and (
        cached("model.safetensors")
        or cached("model.safetensors.index.json")
        or cached("pytorch_model.bin")
        or cached("pytorch_model.bin.index.json")
    )


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (HF_HUB_OFFLINE, or no connection to its endpoint within
    HUB_PROBE_SECONDS), or None when it can. A probe of the endpoint's port: transformers would retry for tens
    of seconds first."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    connected: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_SECONDS).close()
            connected.append(True)
        except OSError:
            pass

    # in a thread: a name lookup without a network can outlast the socket's own timeout
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(HUB_PROBE_SECONDS)
    return None if connected else f"no connection to {endpoint.hostname}:{port}"


def require_available(repo_id: str) -> None:
    """Nothing when `repo_id` is in the local cache or the hub can be reached; else a UserError that says what
    to download and where to put it, before transformers retries."""
    if is_cached(repo_id) or (reason := hub_unreachable()) is None:
        return
    from huggingface_hub import constants

    raise UserError(
        f"--model {repo_id}: not in this machine's Hugging Face cache ({constants.HF_HUB_CACHE}) and the "
        f"hub cannot be reached ({reason}). Download it where there is a network, `hf download "
        f"{repo_id} --local-dir DIR`, copy DIR here and pass --model DIR (or copy that machine's hub "
        f"cache folder to {constants.HF_HUB_CACHE})"
    )
