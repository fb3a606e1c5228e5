"""The steps of `data build`, in order: load, normalise, dedup, decontaminate, analyse, rewrite, verify, export.
Each is a thin wrapper that calls the pure functions of its module and reports counts (see pipeline.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from data_pipeline.answers import analyse_answer
from data_pipeline.config import BuildConfig
from data_pipeline.forms import Rewrite, verify_rewrite
from data_pipeline.pipeline import Context, Step, StepResult, write_jsonl
from data_pipeline.sources import load_eval_set, load_source, resolve_source
from data_pipeline.text import normalise_text


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
            good, bad = load_source(spec, _data_root(ctx.config), ctx.config.problem_field,
                                    ctx.config.answer_field, ctx.config.limit)
            loaded += good
            invalid += bad
            per_source[spec] = {"rows": len(good), "invalid": len(bad)}
            for item in bad[:5]:
                ctx.log(f"  {item['source']} row {item['row']}: {item['reason']}")
            if len(bad) > 5:
                ctx.log(f"  ... and {len(bad) - 5} more invalid rows in {spec} (reports/load.dropped.jsonl)")
        return StepResult(loaded, invalid, {"per_source": per_source})


class Normalise(Step):
    name = "normalise"

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        kept, dropped = [], []
        for row in rows:
            problem, answer = normalise_text(row["problem"]), normalise_text(row["answer"])
            if not problem or not answer:
                dropped.append({**row, "reason": "empty_after_normalisation"})
                continue
            kept.append({**row, "problem": problem, "answer": answer})
        return StepResult(kept, dropped, {"changed": sum(a["problem"] != b["problem"] for a, b in zip(rows, kept, strict=False))})


class Dedup(Step):
    name = "dedup"
    reads = ("near_dup_threshold", "num_perm", "near_dup_bands")

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        from data_pipeline.dedup import exact_duplicates, near_duplicates

        kept, dropped_exact, exact = exact_duplicates(rows)
        kept, dropped_near, near = near_duplicates(kept, ctx.config.near_dup_threshold, ctx.config.num_perm,
                                                   ctx.config.near_dup_bands)
        write_jsonl(ctx.out / "reports" / "duplicate_clusters.jsonl",
                    [{"kind": "exact", **c} for c in exact.pop("cluster_list")]
                    + [{"kind": "near", **c} for c in near.pop("cluster_list")])
        return StepResult(kept, dropped_exact + dropped_near, {"exact": exact, "near": near})


class Decontaminate(Step):
    name = "decontaminate"
    reads = ("decontaminate", "eval_dir", "contamination_ngram", "contamination_threshold")

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        from data_pipeline.decontam import ContaminationIndex, decontaminate

        if not ctx.config.decontaminate:
            return StepResult(rows, [], {"eval_sets": []})
        eval_dir = Path(ctx.config.eval_dir) if ctx.config.eval_dir else None
        sets = {name: load_eval_set(name, eval_dir, _data_root(ctx.config)) for name in ctx.config.decontaminate}
        index = ContaminationIndex(sets, ctx.config.contamination_ngram, ctx.config.contamination_threshold)
        kept, dropped, report = decontaminate(rows, index)
        return StepResult(kept, dropped, report)


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
            out.append({**row, "rewrite": rewrite.__dict__ if rewrite else None, "rewrite_error": None if rewrite else why})
        report: dict[str, Any] = {}
        if for_llm:
            from data_pipeline.llm import LLMRewriter

            rewriter = LLMRewriter.from_config(ctx.config, ctx.out / "llm_cache.jsonl")
            results = rewriter.rewrite_many([(out[i]["problem"], out[i]["answer"]) for i in for_llm], log=ctx.log)
            for i, (rewrite, why) in zip(for_llm, results, strict=True):
                out[i]["rewrite"] = rewrite.__dict__ if rewrite else None
                out[i]["rewrite_error"] = None if rewrite else why
            report["llm"] = rewriter.stats
        report["by_rewriter"] = dict(Counter((r["rewrite"] or {}).get("rewriter", "none") for r in out))
        return StepResult(out, [], report)


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
            if info.value is None:
                ok, why = False, f"original_answer_unparsable_{info.type}"
            else:
                ok, why = verify_rewrite(info.value, Rewrite(**row["rewrite"]))
            if ok:
                kept.append({**row, "verified": True})
            elif ctx.config.allow_unverified:
                kept.append({**row, "verified": False, "verify_error": why})
            else:
                rejected.append({**row, "reason": why})
        write_jsonl(ctx.out / "rejected.jsonl", rejected)
        # the counter groups reasons by their kind ("integer_mismatch: target gives 5..." -> "integer_mismatch")
        reasons = Counter(r["reason"].split(":")[0] for r in rejected)
        return StepResult(kept, [{**r, "reason": r["reason"].split(":")[0]} for r in rejected],
                          {"rejection_reasons": dict(reasons), "kept_unverified": sum(not r["verified"] for r in kept)})


class Export(Step):
    name = "export"
    reads = ("data_source", "ability", "reward_style")

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        from data_pipeline.export import export_parquet

        path = export_parquet(rows, ctx.out / "train.parquet", ctx.config)
        return StepResult(rows, [], {"parquet": str(path), "rows": len(rows)})


def build_steps() -> list[Step]:
    return [Load(), Normalise(), Dedup(), Decontaminate(), Analyse(), RewriteStep(), Verify(), Export()]
