"""Every evaluation metric against values computed by hand on a fixed generations file."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from dapo_suite.core import stats
from eval import metrics
from eval.compare import compare_runs, paired_bootstrap
from eval.scoring import group_by_problem, read_generations, regrade, summarize

# Three problems, four samples each. Texts give the preds in the comments through the real reward.
FIXED = [
    # p1, answer 5: preds 5, 5, 6, None -> correct T T F F, a = 1/2
    (
        "p1",
        "5",
        ["Answer: 5", "so\nAnswer: 5", "Answer: 6", "I am not sure."],
        [10, 20, 30, 40],
        ["stop", "stop", "stop", "length"],
    ),
    # p2, answer 7: preds 3, 3, 7, 3 -> F F T F, a = 1/4
    ("p2", "7", ["Answer: 3", "Answer: 3", "Answer: 7", "Answer: 3"], [5, 5, 5, 5], ["stop"] * 4),
    # p3, answer 1: no answer at all -> F F F F, a = 0
    ("p3", "1", ["hmm"] * 4, [100] * 4, ["length"] * 4),
]


def fixed_records() -> list[dict]:
    records = []
    for pid, answer, texts, tokens, finishes in FIXED:
        for i, (text, count, finish) in enumerate(zip(texts, tokens, finishes, strict=True)):
            records.append(
                {
                    "problem_id": pid,
                    "sample_index": i,
                    "text": text,
                    "finish_reason": finish,
                    "num_tokens": count,
                    "answer": answer,
                }
            )
    return regrade(records)


def write_generations(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_grades_of_the_fixed_file():
    groups = group_by_problem(fixed_records())
    assert [[s["acc"] for s in g] for g in groups.values()] == [
        [True, True, False, False],
        [False, False, True, False],
        [False] * 4,
    ]
    assert [s["pred"] for s in groups["p1"]] == ["5", "5", "6", None]


def test_summary_matches_hand_computed_values():
    r = summarize(fixed_records(), sessions=[{"wall_s": 10.0, "tokens": 520}], expected_n=4)
    se = 0.25 / math.sqrt(3)  # stdev(1/2, 1/4, 0) = 1/4
    assert r["n"] == 4 and r["num_problems"] == 3 and r["num_samples"] == 12 and r["complete"]
    assert r["avg@4"] == r["avg@k"] == pytest.approx(0.25)
    assert r["avg@k_se"] == pytest.approx(se)
    assert r["avg@k_ci95"] == pytest.approx([0.0, 0.25 + 1.959963984540054 * se])
    # pass@2: p1 1 - C(2,2)/C(4,2) = 5/6; p2 1 - C(3,2)/C(4,2) = 1/2; p3 0
    assert r["pass@k"] == pytest.approx({"1": 0.25, "2": (5 / 6 + 1 / 2) / 3, "4": 2 / 3})
    # maj: p1 votes 5 (correct) at every k; p2 votes 3 (wrong); p3 has no vote
    assert r["maj@k"] == pytest.approx({"1": 1 / 3, "2": 1 / 3, "4": 1 / 3})
    assert r["format_failure_rate"] == pytest.approx(5 / 12)
    assert r["truncated_fraction"] == pytest.approx(5 / 12)
    assert r["response_len"] == pytest.approx(
        {
            "mean": 520 / 12,
            "std": metrics.length_statistics([10, 20, 30, 40, 5, 5, 5, 5, 100, 100, 100, 100])["std"],
            "min": 5,
            "median": 25,
            "p90": 100,
            "max": 100,
        }
    )
    assert r["response_len"]["std"] == pytest.approx(
        math.sqrt(sum((x - 520 / 12) ** 2 for x in [10, 20, 30, 40, 5, 5, 5, 5, 100, 100, 100, 100]) / 12)
    )
    assert r["wall_s"] == 10.0 and r["tokens_per_s"] == pytest.approx(52.0)
    assert [
        (p["id"], p["correct"], p["accuracy"], p["majority_correct"], p["format_failures"], p["mean_len"])
        for p in r["problems"]
    ] == [("p1", 2, 0.5, True, 1, 25.0), ("p2", 1, 0.25, False, 0, 5.0), ("p3", 0, 0.0, False, 4, 100.0)]


def test_incomplete_run_is_marked():
    records = [r for r in fixed_records() if not (r["problem_id"] == "p3" and r["sample_index"] == 3)]
    r = summarize(records, expected_n=4)
    assert not r["complete"] and r["n"] == 3 and list(r["pass@k"]) == ["1", "2", "3"]


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_the_binomial_formula(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert stats.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_edges():
    assert stats.pass_at_k(32, 0, 1) == 0.0
    assert stats.pass_at_k(32, 32, 32) == 1.0
    assert stats.pass_at_k(32, 1, 32) == 1.0
    assert stats.pass_at_k(32, 8, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        stats.pass_at_k(4, 1, 5)


def test_k_values():
    assert metrics.k_values(1) == [1]
    assert metrics.k_values(32) == [1, 2, 4, 8, 16, 32]
    assert metrics.k_values(6) == [1, 2, 4, 6]


def test_majority_vote_groups_equal_answers_and_breaks_ties_by_first_seen():
    assert metrics.answer_key("042") == metrics.answer_key("42.0") == metrics.answer_key("$42$") == "42"
    # 42 written three ways beats 7 twice
    assert metrics.majority_correct(["7", "042", "7", "42.0", "$42$"], [False, True, False, True, True])
    # tie 4 vs 5: the first seen (4) wins
    assert not metrics.majority_correct(["4", "5", "5", "4"], [False, True, True, False])
    assert not metrics.majority_correct([None, None], [False, False])
    assert metrics.majority_correct([None, "x + 1", "x+1"], [False, True, True])


def test_standard_error_and_interval_edges():
    assert math.isnan(stats.avg_at_k_standard_error([[True, False]]))
    assert stats.avg_at_k_standard_error([[True], [True]]) == 0.0
    assert stats.confidence_interval_95(0.99, 0.1) == (pytest.approx(0.99 - 0.196, abs=1e-3), 1.0)


def test_truncated_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "generations.jsonl"
    write_generations(path, fixed_records()[:3])
    with path.open("a") as handle:
        handle.write('{"problem_id": "p1", "sample_in')  # a write cut by a kill
    assert len(read_generations(path)) == 3
    read_generations(path, repair=True)
    assert path.read_text().endswith("}\n") and len(read_generations(path)) == 3


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "generations.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=":2 is not valid JSON"):
        read_generations(path)


def test_duplicate_sample_is_an_error():
    records = fixed_records()
    with pytest.raises(ValueError, match="appears twice"):
        group_by_problem(records + records[:1])


def test_paired_bootstrap():
    same = paired_bootstrap([0.5, 0.25, 0.0], [0.5, 0.25, 0.0])
    assert same["delta"] == 0.0 and same["p_value"] == 1.0 and not same["significant"]
    better = paired_bootstrap([0.0] * 30, [0.5] * 15 + [0.25] * 15)
    assert better["delta"] == pytest.approx(0.375) and better["significant"] and better["ci95"][0] > 0
    noisy = paired_bootstrap([0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0])
    assert not noisy["significant"] and noisy["ci95"][0] < 0 < noisy["ci95"][1]


def test_compare_runs_on_fixed_files(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    records = fixed_records()
    write_generations(a, records)
    # B gets every sample of p3 right and nothing else changes
    write_generations(b, [{**r, "acc": True} if r["problem_id"] == "p3" else r for r in records])
    result = compare_runs(a, b, resamples=2000)
    assert result["shared_problems"] == 3
    assert result["avg_a"] == pytest.approx(0.25) and result["avg_b"] == pytest.approx(0.25 + 1 / 3)
    assert [p["id"] for p in result["problems"] if p["acc_a"] != p["acc_b"]] == ["p3"]
    assert result["bootstrap"]["delta"] == pytest.approx(1 / 3)
    # a run directory whose generations are committed gzipped (docs/results) compares the same
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "generations.jsonl.gz").write_bytes(gzip.compress(b.read_bytes()))
    assert compare_runs(a, packed, resamples=2000)["bootstrap"] == result["bootstrap"]


def test_student_t_p_values_by_hand_and_against_the_incomplete_beta():
    # df 1: p = 1 - (2/pi) atan|t|; df 2: p = 1 - |t| / sqrt(t^2 + 2); df 3: 1 - (2/pi)(theta + sin cos theta)
    assert stats.student_t_two_sided_p(2.0, 1) == pytest.approx(1 - 2 / math.pi * math.atan(2.0), abs=1e-14)
    assert stats.student_t_two_sided_p(-1.5, 2) == pytest.approx(1 - 1.5 / math.sqrt(1.5**2 + 2), abs=1e-14)
    theta = math.atan(2.0 / math.sqrt(3))
    assert stats.student_t_two_sided_p(2.0, 3) == pytest.approx(
        1 - 2 / math.pi * (theta + math.sin(theta) * math.cos(theta)), abs=1e-14
    )
    # Every df against an independent formula: p = I_{df/(df+t^2)}(df/2, 1/2) (mpmath, shipped with sympy).
    import mpmath

    for df in range(1, 31):
        for t in (0.0, 0.3, 1.0, 2.2, 5.0, 40.0):
            expected = float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))
            assert stats.student_t_two_sided_p(t, df) == pytest.approx(expected, abs=1e-12), (df, t)


def test_student_t_quantiles_are_the_textbook_values():
    for df, expected in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)):
        assert stats.student_t_quantile(0.95, df) == pytest.approx(expected, abs=1e-4)


def test_paired_t_test_by_hand():
    # d = (1, 2, 3): mean 2, s_d 1, t = 2 / (1 / sqrt 3) = 2 sqrt 3 on 2 df
    result = stats.paired_t_test([0.5, 0.0, 1.0], [1.5, 2.0, 4.0])
    assert result["n"] == 3 and result["df"] == 2 and result["delta"] == pytest.approx(2.0)
    assert result["t"] == pytest.approx(2 * math.sqrt(3))
    assert result["p_value"] == pytest.approx(1 - math.sqrt(12 / 14))
    half = 4.302652729749464 / math.sqrt(3)
    assert result["ci95"] == pytest.approx([2 - half, 2 + half])
    # A and B swapped: the same test, mirrored
    swapped = stats.paired_t_test([1.5, 2.0, 4.0], [0.5, 0.0, 1.0])
    assert swapped["t"] == pytest.approx(-result["t"]) and swapped["p_value"] == pytest.approx(
        result["p_value"]
    )
    # Pairing matters: the same B values paired differently, d = (1.5, 4, 0.5), vary more: p 0.19 instead of
    # 0.07
    assert stats.paired_t_test([0.5, 0.0, 1.0], [2.0, 4.0, 1.5])["p_value"] == pytest.approx(0.1946, abs=1e-4)


def test_paired_t_test_edges():
    assert stats.paired_t_test([1.0, 2.0], [1.0, 2.0])["p_value"] == 1.0
    constant = stats.paired_t_test([1.0, 2.0], [2.0, 3.0])  # d = (1, 1): s_d = 0, t infinite
    assert constant["t"] == math.inf and constant["p_value"] == 0.0
    one = stats.paired_t_test([1.0], [2.0])
    assert one["delta"] == 1.0 and math.isnan(one["p_value"])
    with pytest.raises(ValueError, match="same length"):
        stats.paired_t_test([1.0, 2.0], [1.0])


def test_sign_flip_test_enumerates_the_sign_patterns():
    # d = (1, 2, 3): only all-plus and all-minus reach |sum| >= 6: 2 of 8
    result = stats.sign_flip_test([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    assert (
        result["p_value"] == 0.25 and result["min_p_value"] == 0.25 and result["delta"] == pytest.approx(2.0)
    )
    # d = (1, -2, 3, 4), sum 6: |+-1 +-2 +-3 +-4| >= 6 for 10, 8, 6 and their negatives: 6 of 16
    assert stats.sign_flip_test([0.0] * 4, [1.0, -2.0, 3.0, 4.0])["p_value"] == 0.375
    # Differences equal up to rounding still count as extreme (0.1 + 0.2 != 0.3 in floats)
    assert stats.sign_flip_test([0.0, 0.0], [0.1 + 0.2, 0.3])["p_value"] == 0.5
    assert stats.sign_flip_test([1.0, 2.0], [1.0, 2.0])["p_value"] == 1.0
    assert stats.sign_flip_test([0.0] * 6, [1.0] * 6)["p_value"] == pytest.approx(2 / 64)
    with pytest.raises(ValueError, match="more than 20"):
        stats.sign_flip_test([0.0] * 21, [1.0] * 21)


def test_mean_and_std_use_the_sample_std():
    assert stats.mean_and_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    mean, std = stats.mean_and_std([4.0])
    assert mean == 4.0 and math.isnan(std)
