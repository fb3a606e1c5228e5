"""Export: the verl parquet in the DAPO-Math-17K schema, stats.json and a Markdown dataset card."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from dapo_suite.core.prompts import chat_messages
from dapo_suite.core.provenance import provenance
from data_pipeline.config import BuildConfig


def to_dapo_record(row: dict[str, Any], index: int, config: BuildConfig) -> dict[str, Any]:
    """One row in the DAPO-Math-17K schema; provenance goes into extra_info (params as JSON: their keys
    vary)."""
    rewrite = row["rewrite"]
    return {
        "data_source": config.data_source,
        "prompt": chat_messages(rewrite["problem"]),
        "ability": config.ability,
        "reward_model": {"ground_truth": str(rewrite["answer"]), "style": config.reward_style},
        "extra_info": {
            "index": index,
            "split": "train",
            "source": row["source"],
            "source_row": int(row["row"]),
            "original_problem": row["problem"],
            "original_answer": row["answer"],
            "answer_type": row["answer_type"],
            "solution_steps": row.get("solution_steps"),
            "form": rewrite["form"],
            "params": json.dumps(rewrite["params"], sort_keys=True),
            "target": rewrite["target"],
            "rewriter": rewrite["rewriter"],
            "verified": bool(row.get("verified", False)),
        },
    }


def export_parquet(rows: list[dict[str, Any]], path: Path, config: BuildConfig) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [to_dapo_record(row, i, config) for i, row in enumerate(rows)]
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(records), tmp)
    tmp.replace(path)
    return path


def build_stats(
    metas: dict[str, dict[str, Any]], rows: list[dict[str, Any]], config: BuildConfig
) -> dict[str, Any]:
    """Counts per stage, per source, per answer type (before and after rewriting) and the rejection
    reasons."""
    analysed = metas.get("analyse", {}).get("report", {}).get("answer_types", {})
    return {
        "config": config.to_dict(),
        "stages": {
            name: {"in": m["count_in"], "out": m["count"], "dropped": m["dropped"]}
            for name, m in metas.items()
        },
        "invalid_rows": metas.get("load", {}).get("dropped", {}),
        "per_source": {
            "loaded": metas.get("load", {}).get("report", {}).get("per_source", {}),
            "exported": dict(Counter(r["source"] for r in rows)),
        },
        "answer_types": {"analysed": analysed, "exported": dict(Counter(r["answer_type"] for r in rows))},
        "rewriters": dict(Counter(r["rewrite"]["rewriter"] for r in rows)),
        "ledger": (book := ledger(metas, len(rows))),
        "rejection_reasons": book["dropped"],
        "duplicates": metas.get("dedup", {}).get("report", {}),
        "contamination": metas.get("decontaminate", {}).get("report", {}),
        "selection": metas.get("select", {}).get("report", {}),
        "llm": metas.get("rewrite", {}).get("report", {}).get("llm"),
        "exported_rows": len(rows),
        "unverified_rows": sum(not r.get("verified", False) for r in rows),
        "git_revision": provenance()["git_rev"],
    }


def ledger(metas: dict[str, dict[str, Any]], exported: int) -> dict[str, Any]:
    """Where every input row went: input_rows == exported_rows + the sum of `dropped` (per reason, all
    steps)."""
    load = metas.get("load", {})
    input_rows = load.get("count", 0) + sum(load.get("dropped", {}).values())
    dropped: Counter[str] = Counter()
    for meta in metas.values():
        dropped.update(meta["dropped"])
    return {
        "input_rows": input_rows,
        "exported_rows": exported,
        "dropped_rows": sum(dropped.values()),
        "dropped": dict(dropped),
        "balanced": input_rows == exported + sum(dropped.values()),
    }


def format_ledger(book: dict[str, Any]) -> str:
    reasons = ", ".join(
        f"{kind} {count}" for kind, count in sorted(book["dropped"].items(), key=lambda x: -x[1])
    )
    return (
        f"{book['input_rows']} input rows = {book['exported_rows']} exported + {book['dropped_rows']} "
        "rejected" + (f" ({reasons})" if reasons else "")
    )


def dataset_card(stats: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A short Markdown card: what the data is, how it was made, the counts, an example."""
    stages = "\n".join(
        f"| {name} | {s['in']} | {s['out']} | "
        f"{', '.join(f'{k}: {v}' for k, v in s['dropped'].items()) or '-'} |"
        for name, s in stats["stages"].items()
    )
    types = "\n".join(
        f"| {t} | {n} | {stats['answer_types']['exported'].get(t, 0)} |"
        for t, n in sorted(stats["answer_types"]["analysed"].items(), key=lambda x: -x[1])
    )
    contamination = "\n".join(
        f"| {name} | {c['eval_problems']} | {c['eval_problems_exact']} | {c['eval_problems_near']} | "
        f"{c['train_rows_removed']} |"
        for name, c in stats["contamination"].get("per_eval_set", {}).items()
    )
    example = ""
    if rows:
        r = rows[0]
        example = (
            f"\n## Example\n\nOriginal ({r['source']} row {r['row']}), answer `{r['answer']}`:\n\n> "
            f"{r['problem'][:500]}\n\n"
            f"Rewritten (form `{r['rewrite']['form']}`, parameters `{r['rewrite']['params']}`), answer "
            f"**{r['rewrite']['answer']}**:\n\n> {r['rewrite']['problem'][:700]}\n"
        )
    config = stats["config"]
    unverified = stats["unverified_rows"]
    unverified = f"; {unverified} rows are unverified (extra_info.verified=false)" if unverified else ""
    grams, threshold = (stats["contamination"].get(key, "-") for key in ("ngram", "threshold"))
    return f"""# Integer-answer math data (DAPO-Math-17K style)

Built by `dapo-suite data build` from {", ".join(config["inputs"])} with the `{config["rewriter"]}` rewriter.
{stats["exported_rows"]} problems, each with an integer answer that is proven (sympy) to follow from the
source's original answer{unverified}.
Each rewritten problem was checked to be the same problem as the original (data_pipeline/faithful.py): every
statement and expression of the original is in it word for word, every number too (as digits, fractions or
words), only the final question changed, and that question asks for exactly the verified integer, never for
the original fraction, probability or expression. No two problems share a text (dedup runs again after the
rewrite). Every rejected row is counted by its reason below.

- `train.parquet`: verl schema of DAPO-Math-17K: `data_source` ({config["data_source"]}), `prompt` (one user
  message in DAPO's template), `ability`, `reward_model` {{ground_truth, style}}, `extra_info` {{index,
  source, source_row, original_problem, original_answer, answer_type, solution_steps, form, params, target,
  rewriter, verified}}.
- `stats.json`: every count below; `rejected.jsonl`: every row not exported, with its stage and reason;
  `reports/`: duplicate clusters, contamination matches, dropped rows per stage.

Ledger: {format_ledger(stats["ledger"])}.

## Stages

| stage | in | out | dropped |
|---|---|---|---|
{stages}

## Answer types

| type | analysed | exported |
|---|---|---|
{types}

## Decontamination ({grams}-character grams, threshold {threshold})

| evaluation set | problems | exact in training data | near | training rows removed |
|---|---|---|---|---|
{contamination}

Rejection reasons: {json.dumps(stats["rejection_reasons"])}
{example}
## Licence

Derived data keeps the licence of its sources (MATH and GSM8K: MIT; DAPO-Math-17K: Apache-2.0).
"""
