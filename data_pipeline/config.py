"""The one configuration of the data stage: defaults live here, a YAML file can fill them, CLI flags
override."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_suite.core.errors import UserError
from dapo_suite.core.fields import load_config, within

REWRITERS = ("rules", "llm", "rules+llm")
# The allowed interval of every numeric field (None = unset is always allowed).
RANGES = {
    "limit": "[1, inf)",
    "near_dup_threshold": "(0, 1]",
    "num_perm": "[1, inf)",
    "near_dup_bands": "[1, inf)",
    "contamination_ngram": "[1, inf)",
    "contamination_threshold": "(0, 1]",
    "concurrency": "[1, inf)",
    "max_retries": "[0, inf)",
    "request_timeout_s": "(0, inf)",
    "temperature": "[0, inf)",
    "max_tokens": "[1, inf)",
    "max_failed_fraction": "[0, 1]",
    "max_solution_steps": "[1, inf)",
}


@dataclass
class BuildConfig:
    """Everything `dapo-suite data build` reads. Field comments become the reference in docs/data.md."""

    inputs: list[str] = field(default_factory=list)  # --input: named source, file, or hf:ID[@config][:split]
    out: str = ""  # --out: build directory (stages resume from it)
    data_root: str | None = (
        # root of the raw sets for named sources; default $DAPO_SUITE_DATA, else ~/.cache/dapo-suite/data
        None
    )
    # dotted path of the problem (default: problem/question/prompt.0.content)
    problem_field: str | None = None
    # dotted path of the answer (default: answer/reward_model.ground_truth/...)
    answer_field: str | None = None
    limit: int | None = None  # first N rows of each source (for trials)
    # duplicates: Jaccard of word 5-shingles, MinHash num_perm with `near_dup_bands` LSH bands
    near_dup_threshold: float = 0.8
    num_perm: int = 64
    near_dup_bands: int = 16
    # decontamination (PROVENANCE.md's measure: >= 60 % of an eval problem's 30-character grams)
    decontaminate: list[str] = field(default_factory=lambda: ["aime24", "amc23", "math500", "gsm8k"])
    eval_dir: str | None = None  # folder with {name}.jsonl when the `eval` package does not ship them
    contamination_ngram: int = 30
    contamination_threshold: float = 0.6
    # selection: drop problems whose reference solution takes more steps than this (GSM8K-style worked
    # solutions; rows of sources without one are kept and counted); None keeps every row
    max_solution_steps: int | None = None
    # rewriting
    rewriter: str = "rules"  # rules | llm | rules+llm (rules first, the LLM for what rules cannot do)
    base_url: str | None = None  # OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1
    model: str | None = None  # model name sent to the endpoint
    api_key: str = "EMPTY"
    concurrency: int = 8  # requests in flight at once
    # per request, on 429 / 5xx / timeouts / dropped connections, with exponential backoff
    max_retries: int = 5
    # --request-timeout; a request queued behind 7 others on a CPU server waits
    request_timeout_s: float = 600.0
    temperature: float = 0.0
    max_tokens: int = 1024
    # LLM requests that may fail for good (their rows are rejected) before the build stops
    max_failed_fraction: float = 0.0
    # keep rewrites the verifier cannot prove, flagged extra_info.verified=False
    allow_unverified: bool = False
    # export (DAPO-Math-17K schema, reference doc section 4)
    data_source: str = "math_dapo"
    ability: str = "MATH"
    reward_style: str = "rule-lighteval/MATH_v2"

    def __post_init__(self) -> None:
        if isinstance(self.decontaminate, str):
            self.decontaminate = [s for s in self.decontaminate.split(",") if s.strip()]
        if self.rewriter not in REWRITERS:
            raise UserError(f"rewriter={self.rewriter!r}: choose one of {', '.join(REWRITERS)}.")
        if "llm" in self.rewriter and not (self.base_url and self.model):
            raise UserError(
                "rewriter uses the LLM: set --base-url (e.g. http://127.0.0.1:8000/v1) and --model."
            )
        if self.num_perm % self.near_dup_bands:
            raise UserError(
                f"num_perm ({self.num_perm}) must be a multiple of near_dup_bands ({self.near_dup_bands})."
            )
        problems = [
            f"{name}={getattr(self, name)}: must be in {interval}"
            for name, interval in RANGES.items()
            if getattr(self, name) is not None and not within(getattr(self, name), interval)
        ]
        if problems:
            raise UserError("invalid data build config: " + "; ".join(problems) + ".")

    @classmethod
    def from_sources(cls, yaml_path: str | Path | None = None, **overrides: Any) -> BuildConfig:
        """Defaults, then the YAML file's values, then every override that is not None (`load_config`)."""
        given = {k: v for k, v in overrides.items() if v is not None and v != ()}
        return load_config(cls, yaml_path, given, "data build")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "api_key"}
