"""One evaluation run: build the requests, skip the samples already in `generations.jsonl`, generate the
rest (each appended and flushed as it completes), then score and write the report.

Run directory:
  config.json        resolved settings, package version, git revision (a rerun must match its generation
  settings) generations.jsonl  one line per sample: problem_id, sample_index, text, finish_reason, num_tokens,
  answer,
                     score, acc, pred
  sessions.jsonl     one line per generation session: wall_s, samples, tokens (for tokens/s)
  results.json, report.md, report.png
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from dapo_suite.core.lock import output_lock
from dapo_suite.core.problems import Problem
from dapo_suite.core.prompts import TOOL_INSTRUCTIONS
from dapo_suite.core.provenance import provenance
from dapo_suite.inference.engines import Completion, Engine, Request, Sampling, sample_seed
from eval.config import EvalConfig
from eval.data import load_problems
from eval.engines import engine_dtype, make_engine
from eval.prompts import format_prompt
from eval.scoring import GENERATIONS_FILE, SESSIONS_FILE, grade, read_generations, read_sessions, summarize

CONFIG_FILE = "config.json"


def prepare_run_dir(config: EvalConfig) -> Path:
    """Create the run directory, or check that an existing one was made with the same generation settings."""
    run_dir = config.run_dir
    saved_path = run_dir / CONFIG_FILE
    if saved_path.is_file():
        saved = json.loads(saved_path.read_text())["generation"]
        differ = {k: (saved.get(k), v) for k, v in config.generation_settings().items() if saved.get(k) != v}
        if differ:
            lines = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differ.items())
            raise ValueError(
                f"{run_dir} holds a run with other settings ({lines}). Rerun with the saved settings to "
                f"resume, or pass --out NEW_DIR for a new run."
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not saved_path.is_file():
        saved_path.write_text(
            json.dumps(
                {"generation": config.generation_settings(), "config": config.to_dict(), **provenance()},
                indent=2,
            )
        )
    return run_dir


def build_requests(problems: list[Problem], config: EvalConfig, done: set[tuple[str, int]]) -> list[Request]:
    """One request per (problem, sample) not yet done, in problem order."""
    suffix = TOOL_INSTRUCTIONS if config.tools else ""  # how to call the tool, as in training's prompt
    return [
        Request(
            p.id, i, format_prompt(p.problem, config.template) + suffix, sample_seed(config.seed, p.id, i)
        )
        for p in problems
        for i in range(config.n)
        if (p.id, i) not in done
    ]


def run_eval(config: EvalConfig, engine: Engine | None = None) -> dict:
    """Generate what is missing, then score everything in the run directory; returns results.json's
    content."""
    problems = load_problems(
        config.benchmark, config.file, config.problem_key, config.answer_key, config.id_key, config.limit
    )
    config = dataclasses.replace(
        config, dtype=engine_dtype(config)
    )  # "auto" as run, for the record and resume
    run_dir = prepare_run_dir(config)
    with output_lock(run_dir):
        return _generate_and_score(config, problems, run_dir, engine)


def _generate_and_score(
    config: EvalConfig, problems: list[Problem], run_dir: Path, engine: Engine | None
) -> dict:
    generations = run_dir / GENERATIONS_FILE
    done = {
        (str(r["problem_id"]), int(r["sample_index"])) for r in read_generations(generations, repair=True)
    }
    requests = build_requests(problems, config, done)
    answers = {p.id: p.answer for p in problems}
    if requests:
        print(f"{len(done)} samples on disk, {len(requests)} to generate -> {generations}")
        engine = engine or make_engine(config)
        sampling = Sampling(config.temperature, config.top_p, config.max_tokens, config.chat_template)
        tokens = 0
        start = time.perf_counter()
        with generations.open("a", encoding="utf-8") as handle:

            def emit(completion: Completion) -> None:
                nonlocal tokens
                answer = answers[completion.problem_id]
                record = {
                    "problem_id": completion.problem_id,
                    "sample_index": completion.sample_index,
                    "text": completion.text,
                    "finish_reason": completion.finish_reason,
                    "num_tokens": completion.model_tokens,
                    "answer": answer,
                    **grade(completion.graded_text, answer),
                }
                if config.tools:  # each call, and the model's own text (what was graded)
                    record |= {
                        "model_text": completion.graded_text,
                        "tool_calls": [call.as_dict() for call in completion.tool_calls],
                    }
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                handle.flush()
                tokens += completion.num_tokens

            try:
                engine.generate(requests, sampling, emit)
            finally:
                wall = time.perf_counter() - start
                with (run_dir / SESSIONS_FILE).open("a") as sessions:
                    sessions.write(
                        json.dumps(
                            {
                                "engine": engine.name,
                                "wall_s": wall,
                                "tokens": tokens,
                                "samples": len(requests),
                            }
                        )
                        + "\n"
                    )
    else:
        print(f"All {len(done)} samples are on disk in {generations}: scoring only.")
    return write_results(run_dir, config.to_dict(), [p.id for p in problems], config.n)


def write_results(
    run_dir: Path,
    config: dict,
    problem_order: list[str] | None,
    expected_n: int | None,
    records: list[dict] | None = None,
) -> dict:
    """Score the run directory's generations (or `records`), write results.json, report.md and report.png."""
    from eval.report import write_report

    records = records if records is not None else read_generations(run_dir / GENERATIONS_FILE)
    if problem_order is not None:
        wanted = set(problem_order)
        records = [r for r in records if str(r["problem_id"]) in wanted]
    results = {"config": config, **summarize(records, problem_order, read_sessions(run_dir), expected_n)}
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    write_report(run_dir, results)
    return results
