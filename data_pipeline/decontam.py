"""Decontamination: drop training rows that reproduce an evaluation problem.

A training row is contaminated by an evaluation problem when their `match_key`s are equal (exact), or when at
least `threshold` of the evaluation problem's character `ngram`-grams occur in that one training row (near).
The defaults (30-grams, 60 %) are the measure PROVENANCE.md reports. Character grams of the letters-and-digits
key make the test blind to LaTeX spelling (`\\dfrac` vs `\\frac`, `$` signs, spacing).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from data_pipeline.text import char_ngrams, match_key


class ContaminationIndex:
    """The evaluation problems, indexed by exact key and by n-gram, for the per-row test."""

    def __init__(self, eval_sets: dict[str, list[dict[str, Any]]], ngram: int = 30, threshold: float = 0.6):
        self.ngram, self.threshold = ngram, threshold
        self.items: list[tuple[str, str, str]] = []  # (set name, id, problem)
        self.exact: dict[str, list[int]] = defaultdict(list)
        self.grams: dict[str, list[int]] = defaultdict(list)
        self.sizes: list[int] = []
        for set_name, problems in eval_sets.items():
            for problem in problems:
                index = len(self.items)
                self.items.append((set_name, problem["id"], problem["problem"]))
                key = match_key(problem["problem"])
                self.exact[key].append(index)
                grams = char_ngrams(key, ngram)
                self.sizes.append(len(grams))
                for gram in grams:
                    self.grams[gram].append(index)

    def matches(self, text: str, coverage: dict[int, set[str]] | None = None) -> list[tuple[int, str, float]]:
        """(eval item, 'exact'|'near', overlap) for every evaluation problem this text reproduces.

        `coverage`, when given, collects per evaluation item the grams seen in any text (the whole-corpus
        measure).
        """
        key = match_key(text)
        found = [(i, "exact", 1.0) for i in self.exact.get(key, [])]
        if found:
            return found
        hits: Counter[int] = Counter()
        for gram in char_ngrams(key, self.ngram):
            for i in self.grams.get(gram, ()):
                hits[i] += 1
                if coverage is not None:
                    coverage.setdefault(i, set()).add(gram)
        return [
            (i, "near", n / self.sizes[i])
            for i, n in hits.items()
            if self.sizes[i] and n / self.sizes[i] >= self.threshold
        ]


def decontaminate(
    rows: list[dict[str, Any]], index: ContaminationIndex
) -> tuple[list[dict], list[dict], dict]:
    """(kept, dropped with reason and matches, report with counts per evaluation set, both sides)."""
    kept, dropped = [], []
    eval_hits: dict[int, str] = {}
    coverage: dict[int, set[str]] = {}
    for row in rows:
        matches = index.matches(row["problem"], coverage)
        if not matches:
            kept.append(row)
            continue
        kind = "exact" if any(m[1] == "exact" for m in matches) else "near"
        details = [
            {"eval_set": index.items[i][0], "eval_id": index.items[i][1], "match": k, "overlap": round(o, 3)}
            for i, k, o in matches
        ]
        dropped.append({**row, "reason": f"contaminated_{kind}", "matches": details})
        for i, k, _ in matches:
            if eval_hits.get(i) != "exact":
                eval_hits[i] = k
    per_set: dict[str, dict[str, int]] = {}
    for set_name in dict.fromkeys(item[0] for item in index.items):
        per_set[set_name] = {
            "eval_problems": sum(1 for item in index.items if item[0] == set_name),
            "eval_problems_exact": 0,
            "eval_problems_near": 0,
            "eval_problems_near_corpus": 0,
            "train_rows_removed": sum(
                1 for d in dropped if any(m["eval_set"] == set_name for m in d["matches"])
            ),
        }
    for i, kind in eval_hits.items():
        per_set[index.items[i][0]][f"eval_problems_{kind}"] += 1
    # PROVENANCE.md's measure: the grams of an evaluation problem found anywhere in the training set (not
    # necessarily in one row); it counts a few more near duplicates than the per-row test that removes rows.
    for i, grams in coverage.items():
        if eval_hits.get(i) != "exact" and index.sizes[i] and len(grams) / index.sizes[i] >= index.threshold:
            per_set[index.items[i][0]]["eval_problems_near_corpus"] += 1
    report = {
        "ngram": index.ngram,
        "threshold": index.threshold,
        "per_eval_set": per_set,
        "removed_exact": sum(d["reason"] == "contaminated_exact" for d in dropped),
        "removed_near": sum(d["reason"] == "contaminated_near" for d in dropped),
    }
    return kept, dropped, report
