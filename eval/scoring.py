"""From graded generations to results: read `generations.jsonl`, (re)grade with `dapo_suite.core.reward`, and
compute every metric of `eval.metrics` per benchmark and per problem."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable
from pathlib import Path

from dapo_suite.core import stats
from dapo_suite.core.reward import UNCHECKED, compute_score
from eval import metrics

GENERATIONS_FILE = "generations.jsonl"
SESSIONS_FILE = "sessions.jsonl"  # one line per generation session: wall seconds, samples, tokens


def grade(text: str, answer: str) -> dict:
    """The verdict of one sample: `{"score", "acc", "pred", "timeout", "too_complex"}` from the shared DAPO
    reward (`timeout`, `too_complex`: the checker could not decide, so the sample counts as wrong but is
    reported apart)."""
    verdict = compute_score("eval", text, answer)
    return {
        "score": verdict["score"],
        "acc": bool(verdict["acc"]),
        "pred": verdict["pred"],
        **{reason: bool(verdict[reason]) for reason in UNCHECKED},
    }


def generations_file(path: str | Path) -> Path:
    """The generations file of a run directory (`generations.jsonl`, or its gzip as committed under
    docs/results), or `path` itself when it is a file."""
    path = Path(path)
    if not path.is_dir():
        return path
    plain = path / GENERATIONS_FILE
    packed = path / f"{GENERATIONS_FILE}.gz"
    return packed if packed.is_file() and not plain.is_file() else plain


def read_generations(path: str | Path, repair: bool = False) -> list[dict]:
    """The records of a generations file (`.gz` read as gzip). A last line cut short by a kill is dropped
    (and, with `repair`, removed from the file so appends start on a clean line); a bad line elsewhere is an
    error."""
    path = Path(path)
    if not path.is_file():
        return []
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = raw.split(b"\n")
    records, good_bytes = [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines) - 1 or raw.endswith(b"\n"):
                raise ValueError(f"{path}:{number} is not valid JSON; fix or delete that line.") from None
            if repair:  # an unterminated last line: the write a kill interrupted
                with path.open("r+b") as handle:
                    handle.truncate(good_bytes)
            break
        good_bytes += len(line) + 1
    return records


def read_sessions(run_dir: Path) -> list[dict]:
    path = run_dir / SESSIONS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def group_by_problem(
    records: Iterable[dict], problem_order: list[str] | None = None
) -> dict[str, list[dict]]:
    """Records per problem id, each list sorted by sample index; problems in `problem_order` or first-seen
    order. A (problem, sample) pair present twice is an error: a run never repeats a finished sample."""
    groups: dict[str, dict[int, dict]] = {pid: {} for pid in problem_order or []}
    for record in records:
        samples = groups.setdefault(str(record["problem_id"]), {})
        if record["sample_index"] in samples:
            raise ValueError(f"Sample {record['problem_id']}#{record['sample_index']} appears twice.")
        samples[record["sample_index"]] = record
    return {pid: [s[i] for i in sorted(s)] for pid, s in groups.items() if s}


def regrade(records: list[dict]) -> list[dict]:
    """Records with fresh verdicts (score, acc, pred, timeout) from their text and stored answer."""
    return [
        {**r, **grade(r.get("model_text", r["text"]), r["answer"])} for r in records
    ]  # the model's own words


def tool_statistics(records: list[dict]) -> dict:
    """Tool use over graded records that carry their calls: calls per response, the share of responses that
    call, the share of calls that fail (any outcome but ok) or time out, and the accuracy of responses with
    and without a call."""
    from dapo_suite.inference.tool_loop import tool_use  # torch: only for runs that used the tool

    use = tool_use([[call["outcome"] for call in r.get("tool_calls", [])] for r in records])
    calling = [r for r in records if r.get("tool_calls")]
    silent = [r for r in records if not r.get("tool_calls")]
    return {
        **{key: use[key] for key in ("calls_per_response", "call_rate", "failed_call_rate", "timeouts")},
        "accuracy_with_calls": sum(bool(r["acc"]) for r in calling) / len(calling) if calling else None,
        "accuracy_without_calls": sum(bool(r["acc"]) for r in silent) / len(silent) if silent else None,
    }


def summarize(
    records: list[dict],
    problem_order: list[str] | None = None,
    sessions: list[dict] | None = None,
    expected_n: int | None = None,
) -> dict:
    """Every metric of a set of graded records, plus per-problem rows. `expected_n` marks the run incomplete
    when a problem has fewer samples."""
    if not records:
        raise ValueError("No generations to score yet.")
    groups = group_by_problem(records, problem_order)
    correct = [[bool(s["acc"]) for s in g] for g in groups.values()]
    preds = [[s["pred"] for s in g] for g in groups.values()]
    flat = [s for g in groups.values() for s in g]
    n = min(len(c) for c in correct)
    avg = stats.avg_at_k(correct)
    se = stats.avg_at_k_standard_error(correct)
    wall = sum(s["wall_s"] for s in sessions or [])
    tokens = sum(s["tokens"] for s in sessions or [])
    summary = {
        "num_problems": len(groups),
        "num_samples": len(flat),
        "n": n,
        "complete": expected_n is None or all(len(c) >= expected_n for c in correct),
        f"avg@{n}": avg,
        "avg@k": avg,
        "avg@k_se": se,
        "avg@k_ci95": list(stats.confidence_interval_95(avg, se)),
        "pass@k": {str(k): stats.mean_pass_at_k(correct, k) for k in metrics.k_values(n)},
        "maj@k": {str(k): metrics.maj_at_k(preds, correct, k) for k in metrics.k_values(n)},
        "format_failure_rate": metrics.format_failure_rate([s["pred"] for s in flat]),
        "grader_timeouts": sum(
            bool(s.get("timeout")) for s in flat
        ),  # generations graded before it lack the field
        "grader_too_complex": sum(bool(s.get("too_complex")) for s in flat),
        "truncated_fraction": metrics.truncated_fraction([s["finish_reason"] for s in flat]),
        "response_len": metrics.length_statistics([s["num_tokens"] for s in flat]),
        "wall_s": wall if sessions else None,
        "tokens_per_s": metrics.tokens_per_second(tokens, wall) if sessions else None,
        **({"tools": tool_statistics(flat)} if any("tool_calls" in s for s in flat) else {}),
    }
    summary["problems"] = [
        {
            "id": pid,
            "answer": g[0]["answer"],
            "n": len(g),
            "correct": sum(bool(s["acc"]) for s in g),
            "accuracy": stats.problem_accuracy([bool(s["acc"]) for s in g]),
            "majority_correct": metrics.majority_correct([s["pred"] for s in g], [bool(s["acc"]) for s in g]),
            "format_failures": sum(s["pred"] is None for s in g),
            "mean_len": sum(s["num_tokens"] for s in g) / len(g),
        }
        for pid, g in groups.items()
    ]
    return json_safe(summary)


def json_safe(value):
    """NaN/inf become None so results.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
