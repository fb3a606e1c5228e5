"""`dapo-suite data build` end to end on the shipped raw data (rules rewriter), input formats, invalid-row
reporting, resume, and the DAPO-Math-17K duplicate and contamination counts of PROVENANCE.md."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from dapo_suite.core.errors import UserError
from dapo_suite.core.prompts import DAPO_TEMPLATE
from data_pipeline.build import run_build
from data_pipeline.cli import data
from data_pipeline.config import BuildConfig
from data_pipeline.sources import load_eval_set, load_source


def test_cli_build_math_train_rules(raw_data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "math"
    result = CliRunner().invoke(
        data,
        [
            "build",
            "--input",
            "math_train",
            "--limit",
            "300",
            "--rewriter",
            "rules",
            "--out",
            str(out),
            "--decontaminate",
            "aime24,math500",
        ],
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out / "train.parquet")
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert 200 < len(frame) < 300
    first = frame.iloc[0]
    assert first["data_source"] == "math_dapo" and first["ability"] == "MATH"
    assert first["prompt"][0]["role"] == "user"
    assert first["prompt"][0]["content"].startswith(DAPO_TEMPLATE.split("{problem}")[0])
    assert first["reward_model"]["style"] == "rule-lighteval/MATH_v2"
    assert all(int(gt) == int(gt) for gt in frame["reward_model"].map(lambda r: r["ground_truth"]))
    assert frame["extra_info"].map(lambda e: e["verified"]).all()
    assert list(frame["extra_info"].map(lambda e: e["index"])) == list(range(len(frame)))
    stats = json.loads((out / "stats.json").read_text())
    assert stats["exported_rows"] == len(frame)
    assert stats["stages"]["load"]["out"] == 300 and "rational" in stats["answer_types"]["analysed"]
    assert sum(stats["rejection_reasons"].values()) == len((out / "rejected.jsonl").read_text().splitlines())
    assert "# Integer-answer math data" in (out / "README.md").read_text()
    # resume: nothing changed, every step is skipped; the summary command reads the result
    again = CliRunner().invoke(
        data,
        [
            "build",
            "--input",
            "math_train",
            "--limit",
            "300",
            "--out",
            str(out),
            "--decontaminate",
            "aime24,math500",
        ],
    )
    assert again.output.count("resumed") == 9, again.output
    summary = CliRunner().invoke(data, ["stats", str(out)])
    assert "exported rows" in summary.output


def test_formats_invalid_rows_and_partial_resume(tmp_path: Path) -> None:
    rows = [
        {"q": "What is $1/2+1/4$?", "a": "\\frac34"},
        {"q": "", "a": "3"},
        {"q": "What is 6*7?", "a": None},
        {"q": "What is $\\sqrt{8}$?", "a": "2\\sqrt{2}"},
    ]
    frame = pd.DataFrame(rows)
    frame.to_csv(tmp_path / "s.csv", index=False)
    frame.to_parquet(tmp_path / "s.parquet")
    (tmp_path / "s.json").write_text(json.dumps(rows))
    for suffix in ("csv", "parquet", "json"):
        good, bad = load_source(str(tmp_path / f"s.{suffix}"), problem_field="q", answer_field="a")
        assert [r["row"] for r in good] == [0, 3]
        assert [(r["row"], r["reason"].split(":")[0], r["keys"]) for r in bad] == [
            (1, "missing_problem", ["a", "q"]),
            (2, "missing_answer", ["a", "q"]),
        ]
        assert "no usable answer in field a; the row has keys ['a', 'q']" in bad[1]["reason"]
    logs: list[str] = []
    config = BuildConfig(
        inputs=[str(tmp_path / "s.json")],
        out=str(tmp_path / "out"),
        problem_field="q",
        answer_field="a",
        decontaminate=[],
    )
    stats = run_build(config, log=logs.append)
    assert stats["exported_rows"] == 2 and stats["invalid_rows"] == {
        "missing_problem": 1,
        "missing_answer": 1,
    }
    assert any("row 1: missing_problem" in line for line in logs)
    assert stats["ledger"] == {
        "input_rows": 4,
        "exported_rows": 2,
        "dropped_rows": 2,
        "balanced": True,
        "dropped": {"missing_problem": 1, "missing_answer": 1},
    }
    # a change that only touches export reruns export alone
    logs.clear()
    run_build(BuildConfig(**{**config.__dict__, "data_source": "mine"}), log=logs.append)
    assert sum("resumed" in line for line in logs) == 8
    assert pd.read_parquet(tmp_path / "out" / "train.parquet")["data_source"].tolist() == ["mine", "mine"]


def test_missing_data_root_names_the_variable(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        data,
        ["build", "--input", "math_train", "--out", str(tmp_path), "--data-root", str(tmp_path / "nowhere")],
    )
    assert result.exit_code != 0 and "DAPO_SUITE_DATA" in result.output


def test_dapo_math_17k_duplicates_and_contamination(raw_data_dir: Path) -> None:
    """PROVENANCE.md: 627 repeated texts, 11 with another answer; AMC 2023 8 exact + ~21 near, MATH-500 7 +
    ~19.

    Differences, explained: with `\\dfrac` folded into `\\frac` one more MATH-500 problem is an exact copy
    (8). The per-row test (one training row must hold >= 60 % of the problem's 30-grams) finds 17 near for
    each; the corpus-wide measure PROVENANCE uses (grams found anywhere) finds 19 and 20.
    """
    from data_pipeline.decontam import ContaminationIndex, decontaminate
    from data_pipeline.dedup import exact_duplicates

    rows, invalid = load_source("dapo_math_17k")
    assert len(rows) == 17917 and not invalid
    _, _, report = exact_duplicates(rows)
    assert report["identical_text_repeats"] == 627
    assert report["identical_text_repeats_with_other_answer"] == 11
    index = ContaminationIndex({name: load_eval_set(name) for name in ("aime24", "amc23", "math500")})
    _, _, report = decontaminate(rows, index)
    per_set = report["per_eval_set"]
    assert per_set["aime24"]["eval_problems_exact"] == per_set["aime24"]["eval_problems_near"] == 0
    assert (
        per_set["amc23"]["eval_problems_exact"] == 8
        and 15 <= per_set["amc23"]["eval_problems_near_corpus"] <= 23
    )
    assert per_set["math500"]["eval_problems_exact"] in (7, 8)
    assert 15 <= per_set["math500"]["eval_problems_near_corpus"] <= 23


# A DAPO-Math-17k-style problem whose circled equation labels NFKC would turn into digits (`=0\quad1`).
CIRCLED = (
    "已知 $x^2-3x+2=0\\quad①$ 与 $x-1=0\\quad②$，由 ① ② 得 $x=1$；③ 求 $x+1$ 的值。\n\n"
    "Note:  two  spaces and a full-width ＡＢ stay as written."
)


def test_a_dapo_17k_row_with_circled_labels_is_exported_unchanged(tmp_path: Path) -> None:
    row = {
        "data_source": "DAPO-17k",
        "prompt": [{"content": CIRCLED, "role": "user"}],
        "ability": "math",
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"answer": "", "index": 0, "split": "train"},
    }
    pd.DataFrame([row]).to_parquet(tmp_path / "dapo.parquet")
    run_build(
        BuildConfig(inputs=[str(tmp_path / "dapo.parquet")], out=str(tmp_path / "out"), decontaminate=[]),
        log=lambda _: None,
    )
    exported = pd.read_parquet(tmp_path / "out" / "train.parquet").iloc[0]
    assert exported["prompt"][0]["content"] == DAPO_TEMPLATE.format(problem=CIRCLED)
    assert exported["extra_info"]["original_problem"] == CIRCLED


def _ledger_rows() -> list[dict]:
    aime = load_eval_set("aime24")[0]["problem"]
    return [
        {"problem": "What is 2+3?", "answer": "5"},
        {"problem": "What is  2+3?", "answer": "5"},  # exact duplicate (spacing)
        {"problem": "What is 4+4?", "answer": "8"},
        {"problem": "What is 4+4?", "answer": "9"},  # conflicting answers
        {"problem": aime, "answer": "1"},  # contaminated
        {"problem": "Name the colour of the sky.", "answer": "blue"},  # no integer rewrite
        {"problem": "What is 1/2 + 1/4?", "answer": "\\frac{3}{4}"},  # rewritten to m+n
        {"problem": "", "answer": "3"},
        {"question": "What is 6*7?", "solution_text": "42"},  # invalid
        {"problem": "\x0c\x01 ", "answer": "3"},  # empty after the repairs
    ]


@pytest.mark.parametrize("source", ["arithmetic", "crafted"])
def test_every_input_row_is_exported_or_in_rejected_jsonl_with_its_reason(
    source: str, tmp_path: Path
) -> None:
    spec = source
    if source == "crafted":
        spec = str(tmp_path / "crafted.jsonl")
        Path(spec).write_text("".join(json.dumps(row) + "\n" for row in _ledger_rows()))
    logs: list[str] = []
    stats = run_build(BuildConfig(inputs=[spec], out=str(tmp_path / "out")), log=logs.append)
    book = stats["ledger"]
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert book["balanced"] and book["input_rows"] == book["exported_rows"] + sum(book["dropped"].values())
    assert len(rejected) == book["dropped_rows"] and all(r["reason"] and r["stage"] for r in rejected)
    assert stats["rejection_reasons"] == book["dropped"]
    assert any(line.startswith(f"ledger: {book['input_rows']} input rows = ") for line in logs)
    if source == "crafted":
        assert book["input_rows"] == 10 and book["exported_rows"] == 2
        assert book["dropped"] == {
            "exact_duplicate": 1,
            "conflicting_answers": 2,
            "contaminated_exact": 1,
            "missing_problem": 1,
            "missing_answer": 1,
            "empty_after_repair": 1,
            "no_rule_for_text": 1,
        }
        missing = next(r for r in rejected if r["reason"].startswith("missing_answer"))
        assert "['question', 'solution_text']" in missing["reason"] and "--answer-field" in missing["reason"]


def test_max_solution_steps_keeps_the_short_worked_solutions_and_counts_the_rest(tmp_path: Path) -> None:
    """GSM8K-style solutions are counted in steps (lines before ####); `max_solution_steps` drops the long
    ones with their reason, keeps rows that have no worked solution to judge by, and exports the count."""
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
        {
            "question": "Ann reads 5 pages a day for 3 days, then 2 more. How many pages?",
            "answer": "5*3=<<5*3=15>>15\n15+2=<<15+2=17>>17\n#### 17",
        },
        {
            "question": "Bo walks 2 km, runs twice that, then walks 1 km. Total km?",
            "answer": "2*2=<<2*2=4>>4\n2+4=<<2+4=6>>6\n6+1=<<6+1=7>>7\n#### 7",
        },
        {"question": "What is 9 times 8?", "answer": "72"},
    ]
    source = tmp_path / "worked.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    stats = run_build(
        BuildConfig(inputs=[str(source)], out=str(tmp_path / "out"), decontaminate=[], max_solution_steps=2),
        log=lambda line: None,
    )
    assert stats["ledger"]["dropped"] == {"above_max_solution_steps": 1}
    assert stats["selection"]["kept_without_steps"] == 1
    exported = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert [e["solution_steps"] for e in exported["extra_info"]] == [1, 2, None]
    assert [r["reward_model"]["ground_truth"] for r in exported.to_dict("records")] == ["7", "17", "72"]
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["reason"]) for r in rejected] == [("select", "above_max_solution_steps: 3 > 2")]


def test_every_row_rejected_for_one_reason_stops_the_build(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"question": f"What is {i}+1?", "result": i + 1}) + "\n" for i in range(3))
    )
    with pytest.raises(
        UserError, match=r"every one of the 3 input rows .* missing_answer: .*\['question', 'result'\]"
    ):
        run_build(
            BuildConfig(inputs=[str(rows)], out=str(tmp_path / "out"), decontaminate=[]), log=lambda _: None
        )
