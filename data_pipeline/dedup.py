"""Duplicate removal: exact (same text up to case and spacing) and near (MinHash over word 5-shingles, LSH
banding for candidates, then the exact Jaccard similarity decides).

Policy, and why:
- exact duplicates with the same answer: the first occurrence is kept;
- exact duplicates whose answers disagree: the whole cluster is dropped, since nothing says which answer is
  right (DAPO-Math-17k has 11 such repeats);
- near duplicates (Jaccard >= threshold) with the same answer as the cluster's first row are dropped; those
  with a different answer are kept and reported, because a changed number usually makes a different problem.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from data_pipeline.answers import clean_answer
from data_pipeline.text import dedup_key, match_key, minhash_signature, word_shingles


def exact_duplicates(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(kept, dropped with reasons, report). Pure: rows are not modified."""
    clusters: dict[str, list[int]] = defaultdict(list)
    identical: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        clusters[dedup_key(row["problem"])].append(i)
        identical[row["problem"]].append(i)
    drop: dict[int, str] = {}
    report_clusters = []
    for members in clusters.values():
        if len(members) < 2:
            continue
        answers = {clean_answer(rows[i]["answer"]) for i in members}
        conflicting = len(answers) > 1
        for i in members if conflicting else members[1:]:
            drop[i] = "conflicting_answers" if conflicting else "exact_duplicate"
        report_clusters.append(
            {"ids": [rows[i]["id"] for i in members], "answers": sorted(answers), "conflicting": conflicting}
        )
    # Byte-identical repeats, counted the way PROVENANCE.md does: repeats of an earlier text, and those among
    # them whose answer differs from that earlier text's answer.
    repeats = sum(len(m) - 1 for m in identical.values())
    repeat_conflicts = sum(
        1 for m in identical.values() for i in m[1:] if rows[i]["answer"] != rows[m[0]]["answer"]
    )
    kept = [row for i, row in enumerate(rows) if i not in drop]
    dropped = [{**rows[i], "reason": reason} for i, reason in sorted(drop.items())]
    report = {
        "identical_text_repeats": repeats,
        "identical_text_repeats_with_other_answer": repeat_conflicts,
        "clusters": len(report_clusters),
        "conflicting_clusters": sum(c["conflicting"] for c in report_clusters),
        "cluster_list": report_clusters,
    }
    return kept, dropped, report


def near_duplicates(
    rows: list[dict[str, Any]], threshold: float = 0.8, num_perm: int = 64, bands: int = 16, shingle: int = 5
) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(kept, dropped with reasons, report) for Jaccard(word `shingle`-grams) >= threshold."""
    rows_per_band = num_perm // bands
    shingles = [word_shingles(match_key(row["problem"]), shingle) for row in rows]
    signatures = (
        np.stack([minhash_signature(s, num_perm) for s in shingles]) if rows else np.zeros((0, num_perm))
    )
    candidates: set[tuple[int, int]] = set()
    for band in range(bands):
        buckets: dict[bytes, list[int]] = defaultdict(list)
        block = signatures[:, band * rows_per_band : (band + 1) * rows_per_band]
        for i in range(len(rows)):
            buckets[block[i].tobytes()].append(i)
        for members in buckets.values():
            if 1 < len(members) <= 200:  # a bucket this full holds empty or boilerplate texts: skip it
                candidates.update((a, b) for k, a in enumerate(members) for b in members[k + 1 :])
    parent = list(range(len(rows)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in candidates:
        sa, sb = shingles[a], shingles[b]
        union = np.union1d(sa, sb).size
        if union and np.intersect1d(sa, sb, assume_unique=True).size / union >= threshold:
            ra, rb = find(a), find(b)
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(rows)):
        groups[find(i)].append(i)
    drop: dict[int, str] = {}
    report_clusters = []
    for root, members in groups.items():
        if len(members) < 2:
            continue
        first_answer = clean_answer(rows[root]["answer"])
        differing = [i for i in members[1:] if clean_answer(rows[i]["answer"]) != first_answer]
        for i in members[1:]:
            if i not in differing:
                drop[i] = "near_duplicate"
        report_clusters.append(
            {
                "ids": [rows[i]["id"] for i in members],
                "answers": [rows[i]["answer"] for i in members],
                "conflicting": bool(differing),
            }
        )
    kept = [row for i, row in enumerate(rows) if i not in drop]
    dropped = [{**rows[i], "reason": reason} for i, reason in sorted(drop.items())]
    report = {
        "clusters": len(report_clusters),
        "conflicting_clusters": sum(c["conflicting"] for c in report_clusters),
        "candidate_pairs": len(candidates),
        "cluster_list": report_clusters,
    }
    return kept, dropped, report
