"""The steps of `data build`, in order: load, repair, dedup, decontaminate, select, analyse, rewrite, verify,
export.
Each is a thin wrapper that calls the pure functions of its module and reports counts (see pipeline.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from dapo_suite.core.errors import UserError
from data_pipeline.answers import analyse_answer
from data_pipeline.config import BuildConfig
from data_pipeline.faithful import check_faithful
from data_pipeline.forms import Rewrite, verify_rewrite
from data_pipeline.pipeline import Context, Step, StepResult, write_jsonl
from data_pipeline.sources import load_eval_set, load_source, resolve_source
from data_pipeline.text import REPAIRS, dedup_key, repair_text


def _data_root(config: BuildConfig) -> Path | None:
    return Path(config.data_root) if config.data_root else None


class Load(Step):
    name = "load"
    reads = ("inputs", "data_root", "problem_field", "answer_field", "limit")

    def salt(self, config: BuildConfig) -> str:
        parts = []
        for spec in config.inputs:
            kind, location = resolve_source(spec, _data_root(config))
            if kind != "hf":
                stat = Path(location).stat()
                parts.append(f"{location}:{stat.st_size}:{int(stat.st_mtime)}")
        return "|".join(parts)

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        loaded, invalid, per_source = [], [], {}
        for spec in ctx.config.inputs:
            good, bad = load_source(
                spec,
                _data_root(ctx.config),
                ctx.config.problem_field,
                ctx.config.answer_field,
                ctx.config.limit,
            )
            loaded += good
            invalid += bad
            per_source[spec] = {"rows": len(good), "invalid": len(bad)}
            for item in bad[:5]:
                ctx.log(f"  {item['source']} row {item['row']}: {item['reason']}")
            if len(bad) > 5:
                ctx.log(f"  ... and {len(bad) - 5} more invalid rows in {spec} (reports/load.dropped.jsonl)")
        return StepResult(loaded, invalid, {"per_source": per_source})


class Repair(Step):
    """The documented repairs only (text.REPAIRS); the text is otherwise exported as the source gives it."""

    name = "repair"

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        kept, dropped = [], []
        changed: Counter[str] = Counter()
        for row in rows:
            changed.update(name for name, pattern, _ in REPAIRS if pattern.search(row["problem"]))
            problem, answer = repair_text(row["problem"]), repair_text(row["answer"])
            if not problem or not answer:
                dropped.append(
                    {**row, "reason": "empty_after_repair: only whitespace and control characters"}
                )
                continue
            kept.append({**row, "problem": problem, "answer": answer})
        return StepResult(kept, dropped, {"rows_repaired": dict(changed)})


class Dedup(Step):
    name = "dedup"
    reads = ("near_dup_threshold", "num_perm", "near_dup_bands")

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        from data_pipeline.dedup import exact_duplicates, near_duplicates

        kept, dropped_exact, exact = exact_duplicates(rows)
        kept, dropped_near, near = near_duplicates(
            kept, ctx.config.near_dup_threshold, ctx.config.num_perm, ctx.config.near_dup_bands
        )
        write_jsonl(
            ctx.out / "reports" / "duplicate_clusters.jsonl",
            [{"kind": "exact", **c} for c in exact.pop("cluster_list")]
            + [{"kind": "near", **c} for c in near.pop("cluster_list")],
        )
        return StepResult(kept, dropped_exact + dropped_near, {"exact": exact, "near": near})


class Decontaminate(Step):
    name = "decontaminate"
    reads = ("decontaminate", "eval_dir", "contamination_ngram", "contamination_threshold")

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        from data_pipeline.decontam import ContaminationIndex, decontaminate

        if not ctx.config.decontaminate:
            return StepResult(rows, [], {"eval_sets": []})
        eval_dir = Path(ctx.config.eval_dir) if ctx.config.eval_dir else None
        sets = {
            name: load_eval_set(name, eval_dir, _data_root(ctx.config)) for name in ctx.config.decontaminate
        }
        index = ContaminationIndex(sets, ctx.config.contamination_ngram, ctx.config.contamination_threshold)
        kept, dropped, report = decontaminate(rows, index)
        return StepResult(kept, dropped, report)


class Select(Step):
    """Difficulty selection by the reference solution's step count (`--max-solution-steps`). Rows whose source
    gives no worked solution (MATH, the arithmetic set) have nothing to judge by: they are kept, and
    counted."""

    name = "select"
    reads = ("max_solution_steps",)

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        limit = ctx.config.max_solution_steps
        histogram = dict(sorted(Counter(str(row.get("solution_steps")) for row in rows).items()))
        if limit is None:
            return StepResult(rows, [], {"solution_steps": histogram})
        kept = [row for row in rows if row.get("solution_steps") is None or row["solution_steps"] <= limit]
        dropped = [
            {**row, "reason": f"above_max_solution_steps: {row['solution_steps']} > {limit}"}
            for row in rows
            if row.get("solution_steps") is not None and row["solution_steps"] > limit
        ]
        return StepResult(
            kept,
            dropped,
            {
                "solution_steps": histogram,
                "max_solution_steps": limit,
                "kept_without_steps": histogram.get("None", 0),
            },
        )


class Analyse(Step):
    name = "analyse"

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        out = []
        for row in rows:
            info = analyse_answer(row["answer"])
            out.append({**row, "answer_type": info.type})
        return StepResult(out, [], {"answer_types": dict(Counter(r["answer_type"] for r in out))})


class RewriteStep(Step):
    name = "rewrite"
    reads = ("rewriter", "model", "temperature", "max_tokens")

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        from data_pipeline.rules import rewrite_with_rules

        out, for_llm = [], []
        use_rules = ctx.config.rewriter in ("rules", "rules+llm")
        for row in rows:
            info = analyse_answer(row["answer"])
            if use_rules or info.type == "integer":
                rewrite, why = rewrite_with_rules(row["problem"], info)
            else:
                rewrite, why = None, "not_tried"
            if rewrite is None and "llm" in ctx.config.rewriter:
                for_llm.append(len(out))
            out.append(
                {
                    **row,
                    "rewrite": rewrite.__dict__ if rewrite else None,
                    "rewrite_error": None if rewrite else why,
                }
            )
        report: dict[str, Any] = {}
        if for_llm:
            from data_pipeline.llm import LLMRewriter

            rewriter = LLMRewriter.from_config(ctx.config, ctx.out / "llm_cache.jsonl")
            results = rewriter.rewrite_many([(out[i]["problem"], out[i]["answer"]) for i in for_llm])
            _check_failures([why for rewrite, why in results if rewrite is None], len(for_llm), ctx)
            for i, (rewrite, why) in zip(for_llm, results, strict=True):
                out[i]["rewrite"] = rewrite.__dict__ if rewrite else None
                out[i]["rewrite_error"] = None if rewrite else why
            report["llm"] = rewriter.stats
        report["by_rewriter"] = dict(Counter((r["rewrite"] or {}).get("rewriter", "none") for r in out))
        return StepResult(out, [], report)


def _check_failures(reasons: list[str], requests: int, ctx: Context) -> None:
    """Stop the build when LLM requests failed for good (not answers the verifier refused) beyond what
    --max-failed-fraction allows; answers already received are cached, so a rerun only repeats the
    failures."""
    failed = [why for why in reasons if why.startswith("llm_request_failed")]
    if not failed:
        return
    config = ctx.config
    last = failed[-1].split(": ", 1)[-1]
    if len(failed) == requests:
        raise UserError(
            f"--base-url {config.base_url}: all {requests} LLM requests failed (model {config.model}); "
            f"the last error: {last}. Check that the server is up and serves --model."
        )
    message = f"{len(failed)} of {requests} LLM requests failed (last error: {last})"
    if len(failed) > config.max_failed_fraction * requests:
        raise UserError(
            f"{message}. Rerun to retry only those (answers are cached), or pass --max-failed-fraction "
            f"{len(failed) / requests:.2f} to export without them."
        )
    ctx.log(
        f"  warning: {message}; their rows are rejected (--max-failed-fraction {config.max_failed_fraction})"
    )


class Verify(Step):
    name = "verify"
    reads = ("allow_unverified",)

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        kept, rejected = [], []
        for row in rows:
            if row["rewrite"] is None:
                rejected.append({**row, "reason": row["rewrite_error"] or "no_rewrite"})
                continue
            info = analyse_answer(row["answer"])
            rewrite = Rewrite(**row["rewrite"])
            if info.value is None:
                ok, why = False, f"original_answer_unparsable_{info.type}"
            else:
                ok, why = verify_rewrite(info.value, rewrite)
            if ok:
                ok, why = check_faithful(row["problem"], rewrite)
            if ok:
                kept.append({**row, "verified": True})
            elif ctx.config.allow_unverified:
                kept.append({**row, "verified": False, "verify_error": why})
            else:
                rejected.append({**row, "reason": why})
        kept, duplicates = _one_answer_per_prompt(kept)
        return StepResult(
            kept,
            rejected + duplicates,
            {"kept_unverified": sum(not r["verified"] for r in kept), "rewrite_duplicates": len(duplicates)},
        )


def _one_answer_per_prompt(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Dedup again after rewriting: two sources can be rewritten into one text. Copies with the same answer
    keep the first row; a text with different answers is dropped whole (its gold answer would be a coin
    toss)."""
    by_text: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_text.setdefault(dedup_key(row["rewrite"]["problem"]), []).append(row)
    kept, dropped = [], []
    for group in by_text.values():
        answers = {row["rewrite"]["answer"] for row in group}
        if len(answers) > 1:
            dropped += [
                {
                    **row,
                    "reason": f"rewrite_duplicate_conflict: {len(group)} rows share the rewritten text "
                    f"with answers {sorted(answers)}",
                }
                for row in group
            ]
        else:
            kept.append(group[0])
            dropped += [
                {**row, "reason": f"rewrite_duplicate: same rewritten text and answer as {group[0]['id']}"}
                for row in group[1:]
            ]
    order = {id(row): i for i, row in enumerate(rows)}
    return sorted(kept, key=lambda row: order[id(row)]), dropped


class Export(Step):
    name = "export"
    reads = ("data_source", "ability", "reward_style")

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        from data_pipeline.export import export_parquet

        path = export_parquet(rows, ctx.out / "train.parquet", ctx.config)
        return StepResult(rows, [], {"parquet": str(path), "rows": len(rows)})


def build_steps() -> list[Step]:
    return [
        Load(),
        Repair(),
        Dedup(),
        Decontaminate(),
        Select(),
        Analyse(),
        RewriteStep(),
        Verify(),
        Export(),
    ]
