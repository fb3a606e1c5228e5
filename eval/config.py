"""`EvalConfig`: every setting of an evaluation run, defaults = the DAPO protocol (paper sec. 4.1, reference
doc sec. 4): 32 samples per problem, T = 1.0, top_p = 0.7, at most 20480 new tokens, the DAPO prompt inside
the model's chat template. Load from YAML (`--config FILE`); CLI flags given explicitly override it."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from dapo_suite.core.fields import load_config

ENGINES = ("auto", "hf", "vllm", "openai")

# Settings that change what is generated or graded: a run directory refuses to resume under other values.
# The rest (engine, batch size, concurrency, retries, output dir) only change how fast it gets there.
GENERATION_KEYS = (
    "benchmark",
    "file",
    "problem_key",
    "answer_key",
    "id_key",
    "model",
    "endpoint",
    "n",
    "temperature",
    "top_p",
    "max_tokens",
    "template",
    "chat_template",
    "seed",
    "limit",
    "dtype",
    "tools",
)
TOOLS = (
    "python",
)  # --tools: the Python sandbox (dapo_suite/core/sandbox), as the trainer's multi_turn runs it


@dataclass
class EvalConfig:
    # a shipped benchmark (aime24, amc23, math500, gsm8k); ignored with `file`
    benchmark: str | None = "aime24"
    file: str | None = None  # any .jsonl/.parquet with problem and answer columns
    problem_key: str = "problem"  # column of the problem text (dotted keys read nested fields)
    answer_key: str = "answer"  # column of the ground truth
    id_key: str = "id"  # column of a unique id (row number when absent)
    # HF directory or hub id; None = the embedded SmolLM2-135M-Instruct; served name with `endpoint`
    model: str | None = None
    # base URL of an OpenAI-compatible server (`vllm serve`, `transformers serve`)
    endpoint: str | None = None
    engine: str = "auto"  # auto: openai with an endpoint, else vllm when a GPU and vllm are present, else hf
    n: int = 32  # samples per problem (DAPO: avg@32)
    temperature: float = 1.0  # DAPO validation temperature
    top_p: float = 0.7  # DAPO validation top_p
    max_tokens: int = 20480  # L_max, the paper's response budget
    template: str = "dapo"  # prompt template name (dapo, boxed, raw) or a literal string holding {problem}
    chat_template: bool = True  # wrap the prompt in the model's chat template
    seed: int = 0
    limit: int | None = None  # evaluate only the first `limit` problems
    out: str | None = None  # run directory; default runs/eval/<benchmark>-<model>
    # hf/vllm weights dtype; "auto": bfloat16 for vllm, and for hf where bf16 matmuls are native (a bf16 GPU,
    # an AVX-512 BF16/AMX CPU), else float32 (on an AVX2 CPU bf16 is emulated and slower). Resolved before the
    # run directory is made, so its config records the dtype used.
    dtype: str = "auto"
    tools: str | None = None  # "python": the model may run ```python blocks in the sandbox between its turns
    batch_size: int = 64  # hf: sequences generated together (64-128 is the CPU sweet spot)
    concurrency: int = 64  # openai: requests in flight
    max_retries: int = 6  # openai: retries per request, exponential backoff from 1 s
    request_timeout: float = 3600.0  # openai: seconds per request

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r}: choose one of {', '.join(ENGINES)}.")
        if self.n < 1:
            raise ValueError(f"n={self.n}: sample at least 1 response per problem (DAPO uses 32).")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens}: must be at least 1 (DAPO uses 20480).")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0 (0 = greedy; DAPO uses 1.0).")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1] (DAPO uses 0.7).")
        if self.limit is not None and self.limit < 1:
            raise ValueError(
                f"limit={self.limit}: pass a positive number of problems, or leave it unset for all."
            )
        if self.engine == "openai" and not self.endpoint:
            raise ValueError("engine=openai needs --endpoint URL (e.g. http://127.0.0.1:8000/v1).")
        if self.endpoint and self.engine in ("hf", "vllm"):
            raise ValueError(
                f"--endpoint is served by engine=openai, not {self.engine}: drop --engine or --endpoint."
            )
        if self.tools is not None and self.tools not in TOOLS:
            raise ValueError(f"--tools {self.tools!r}: the tools are {', '.join(TOOLS)}.")
        if self.tools and self.engine == "vllm":
            raise ValueError(
                "--tools python runs with the hf engine (the tool loop continues the model's own "
                "tokens) or over --endpoint (a vLLM server among them); use --engine hf or --endpoint URL."
            )
        if self.file is None and self.benchmark is None:
            raise ValueError("Name a benchmark (aime24, amc23, math500, gsm8k) or pass --file PATH.")
        if self.batch_size < 1 or self.concurrency < 1:
            raise ValueError("batch_size and concurrency must be at least 1.")
        if self.max_retries < 0:
            raise ValueError(
                f"max_retries={self.max_retries}: retries per request must be >= 0 (0 = no retry)."
            )
        if self.request_timeout <= 0:
            raise ValueError(f"request_timeout={self.request_timeout}: seconds per request must be > 0.")

    @property
    def dataset_name(self) -> str:
        return Path(self.file).stem if self.file else str(self.benchmark)

    @property
    def run_dir(self) -> Path:
        """`out`, else runs/eval/<benchmark>-<model>: the same arguments find the same directory (resume)."""
        if self.out:
            return Path(self.out)
        model = self.model or ("endpoint" if self.endpoint else "embedded")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model.rstrip("/")).name or model)
        return Path("runs") / "eval" / f"{self.dataset_name}-{slug}"

    def generation_settings(self) -> dict:
        """The settings a resumed run must share with the run it continues."""
        return {key: getattr(self, key) for key in GENERATION_KEYS}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> EvalConfig:
        """Settings from a YAML mapping (optionally under a top-level `eval:` key), then `overrides`
        (`load_config`)."""
        return load_config(cls, path, overrides, "eval", section="eval")
