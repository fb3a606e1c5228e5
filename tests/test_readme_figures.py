"""Every figure of the README's results table, recomputed from the raw output committed under docs/results/.

Each row of the table is parsed (its figures as printed) and checked against what the committed files give, at the
precision the row prints, together with the CPU the row names. A row without a check here fails, so a new row
needs its evidence committed and a check written; a figure edited by hand, or evidence replaced without the
README, fails too.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

# The short CPU names the table uses, from the CPU line the benchmarks and runs record.
EPYC = "EPYC"  # 2-core AMD EPYC (Zen 5), AVX-512 BF16, no AMX
XEON = "Xeon"  # 2-core Intel Xeon, AVX-512 BF16 and AMX


def cpu_name(description: str) -> str:
    """EPYC or Xeon (with AVX-512 BF16), from a recorded CPU line; anything else is named in full."""
    flags = description.lower()
    if "avx512_bf16" in flags and "epyc" in flags and "amx" not in flags:
        return EPYC
    if "avx512_bf16" in flags and "xeon" in flags:  # AMX: the runs before AMX was logged do not list it
        return XEON
    return description


def results_table() -> dict[str, dict[str, str]]:
    """The README's results table: one dict per row (stage, measured, result, cpu), keyed by the stage's link text."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["stage", "measured", "result", "CPU"], header
    rows = {}
    for line in lines[2:]:
        cells = dict(zip([name.lower() for name in header],
                         (cell.strip() for cell in line.strip().strip("|").split(" | ")), strict=True))
        name = re.match(r"\[([^\]]+)\]", cells["stage"])
        assert name, f"a results row without a link to its evidence: {line}"
        rows[name.group(1)] = cells
    return rows


def shows(printed: str, value: float) -> bool:
    """True when `printed` is `value` rounded to the decimals printed (either neighbour at an exact half)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed) - value) <= 0.5 * 10 ** -decimals + 1e-9


def figures(cell: str, pattern: str) -> tuple[str, ...]:
    found = re.search(pattern, cell)
    assert found, f"expected {pattern!r} in the README cell: {cell}"
    return found.groups()


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_demo(row: dict[str, str]) -> None:
    seeds = RESULTS / "demo" / "seeds.json"
    if not seeds.is_file():
        assert "being re-measured" in row["result"], row
        pytest.skip("docs/results/demo/seeds.json is not committed yet (scripts/demo_seeds.py writes it); "
                    "the demo row says 'being re-measured' until then")
    data = json.loads(seeds.read_text())
    # per arm: "ARM MEDIAN % (LOW-HIGH), MET of SEEDS", the measured cell saying what the figures are
    shown = re.findall(r"([\w-]+) \**([\d.]+) %\** \(([\d.]+)-([\d.]+)\), (\d+) of (\d+)", row["result"])
    assert "median (range)" in row["measured"] and "meeting the target" in row["measured"], row["measured"]
    assert "bf16" in {arm for arm, *_ in shown}, row["result"]  # the demo's default, always stated
    for arm, median, low, high, met, total in shown:
        runs = [run for run in data["runs"] if run["arm"] == arm]
        after = [100 * run["after"] for run in runs]
        assert int(total) == len(runs) and shows(median, statistics.median(after)), arm
        assert shows(low, min(after)) and shows(high, max(after)), arm
        assert int(met) == sum(bool(run["meets_target"]) for run in runs), arm
    assert {run["arm"] for run in data["runs"]} == {arm for arm, *_ in shown}  # no arm left out of the row
    assert row["cpu"] in (data["machine"], cpu_name(data["machine"])), (row["cpu"], data["machine"])


def check_gsm8k(row: dict[str, str]) -> None:
    folder = RESULTS / "gsm8k"
    gsm8k = json.loads((folder / "compare_gsm8k.json").read_text())
    math500 = json.loads((folder / "compare_math500.json").read_text())
    before, after, delta, low, high, m_before, m_after = figures(
        row["result"], r"([\d.]+) -> \*\*([\d.]+) %\*\* \(\+([\d.]+) points, CI \+([\d.]+) to \+([\d.]+)\); "
                       r"MATH-500 ([\d.]+) -> ([\d.]+) %")
    # The comparison files are what `eval compare` made of the committed eval folders: check that first.
    for compare, name in ((gsm8k, "gsm8k"), (math500, "math500")):
        for side, key in (("before", "avg_a"), ("after", "avg_b")):
            results = json.loads((folder / "eval" / f"{name}-{side}" / "results.json").read_text())
            assert results["complete"] and results["avg@k"] == pytest.approx(compare[key])
    samples = [json.loads(line) for line in
               gzip.open(folder / "eval" / "gsm8k-after" / "generations.jsonl.gz", "rt").read().splitlines()]
    assert sum(s["acc"] for s in samples) / len(samples) == pytest.approx(gsm8k["avg_b"])
    assert shows(before, 100 * gsm8k["avg_a"]) and shows(after, 100 * gsm8k["avg_b"])
    assert shows(delta, 100 * gsm8k["bootstrap"]["delta"])
    assert shows(low, 100 * gsm8k["bootstrap"]["ci95"][0]) and shows(high, 100 * gsm8k["bootstrap"]["ci95"][1])
    assert shows(m_before, 100 * math500["avg_a"]) and shows(m_after, 100 * math500["avg_b"])
    assert f"({gsm8k['shared_problems']:,})" in row["measured"]
    assert row["cpu"] == EPYC  # docs/results/gsm8k/README.md, "Machine and time": the runs record no CPU line


def paired(folder: str, a: str, b: str, measure: str) -> dict:
    tests = json.loads((RESULTS / folder / "ladder.json").read_text())["tests"]
    return next(t for t in tests if (t["a"], t["b"]) == (a, b))["measures"][measure]


def check_ladder(row: dict[str, str]) -> None:
    test = paired("ladder", "+token-loss", "dapo", "heldout_acc")
    delta, same, n, p = figures(row["result"], r"\*\*([+-][\d.]+) points\*\*, same sign in (\d) of (\d) seeds, p ([\d.]+)")
    rows = {r["rung"]: r for r in json.loads((RESULTS / "ladder" / "ladder.json").read_text())["rows"]}
    diffs = [b - a for a, b in zip(rows["+token-loss"]["heldout_acc"]["per_seed"],
                                   rows["dapo"]["heldout_acc"]["per_seed"], strict=True)]
    assert shows(delta, 100 * test["t_test"]["delta"]) and shows(p, test["t_test"]["p_value"])
    assert int(n) == test["t_test"]["n"] == len(diffs)
    assert int(same) == sum((d > 0) == (test["t_test"]["delta"] > 0) for d in diffs if d)
    assert test["t_test"]["p_value"] > 0.05 and ("direction only" in row["result"] or "no difference" in row["result"])
    low, high, start = figures(row["result"], r"every rung learns \(([\d.]+)-([\d.]+) % from ([\d.]+) %\)")
    after = [100 * r["heldout_acc"]["mean"] for r in rows.values()]
    before = [100 * r["before"] for r in rows.values()]
    assert shows(low, min(after)) and shows(high, max(after)) and all(shows(start, value) for value in before)
    assert row["cpu"] == EPYC  # docs/results/ladder/README.md: the runs record no CPU line


def check_entropy(row: dict[str, str]) -> None:
    rows = {r["rung"]: r for r in json.loads((RESULTS / "entropy" / "ladder.json").read_text())["rows"]}
    test = paired("entropy", "grpo", "clip-higher", "entropy")
    high, low, p = figures(row["result"], r"([\d.]+) vs ([\d.]+) nats, p ([\d.]+)")
    assert shows(high, rows["clip-higher"]["entropy"]["mean"]) and shows(low, rows["grpo"]["entropy"]["mean"])
    assert shows(p, test["t_test"]["p_value"]) and "direction only" in row["result"]
    assert f"{len(rows['grpo']['seeds'])} seeds" in row["measured"]
    assert row["cpu"] == XEON  # docs/results/entropy/README.md: the runs record no CPU line


def check_token_loss(row: dict[str, str]) -> None:
    folder = RESULTS / "token-loss"
    steps = [r for r in jsonl(folder / "sample-mean" / "seed-0" / "metrics.jsonl") if "response_len/mean" in r]
    lengths = [r["response_len/mean"] for r in sorted(steps, key=lambda r: r["step"])]
    first, last = figures(row["result"], r"\((\d+) -> (\d+) tokens, steps 1-10 vs 21-30\)")
    assert len(lengths) == 30 and row["result"].startswith("not shown")
    assert shows(first, statistics.mean(lengths[:10])) and shows(last, statistics.mean(lengths[20:]))
    for arm in ("sample-mean", "token-mean"):
        config = (folder / arm / "seed-0" / "config.yaml").read_text()
        machine = re.search(r"^machine: (.*)$", config, re.MULTILINE).group(1)
        assert row["cpu"] == cpu_name(machine)


def check_verl_cpu(row: dict[str, str]) -> None:
    def merged(side: str) -> dict[int, dict]:
        steps: dict[int, dict] = {}
        for record in jsonl(RESULTS / "verl-cpu" / side / "metrics.jsonl"):
            steps.setdefault(int(record["step"]), {}).update(record)
        return steps

    verl, ours = merged("verl"), merged("embedded")
    v0, v3, e0, e3, faster = figures(
        row["result"], r"verl ([\d.]+) -> ([\d.]+) %, embedded ([\d.]+) -> ([\d.]+) %\); embedded ([\d.]+)x faster")
    assert shows(v0, 100 * verl[0]["val/acc"]) and shows(v3, 100 * verl[3]["val/acc"])
    assert shows(e0, 100 * ours[0]["val/acc"]) and shows(e3, 100 * ours[3]["val/acc"])
    seconds = {name: sum(s["perf/step_seconds"] for s in steps.values() if "perf/step_seconds" in s)
               for name, steps in (("verl", verl), ("embedded", ours))}
    assert shows(faster, seconds["verl"] / seconds["embedded"])
    assert row["cpu"] == XEON  # docs/results/verl-cpu/README.md: the runs record no CPU line


def check_time_to_accuracy(row: dict[str, str]) -> None:
    folder = RESULTS / "time-to-accuracy"
    curves = jsonl(folder / "curves.jsonl")
    target = json.loads((folder / "summary.json").read_text())["target"]
    seeds = sorted({c["seed"] for c in curves})
    first: dict[str, list[float]] = {}  # minutes to the target per seed; never: beyond any time
    for side in ("ours", "ours-trl-settings", "trl"):
        first[side] = []
        for seed in seeds:
            points = sorted((c for c in curves if c["side"] == side and c["seed"] == seed), key=lambda c: c["seconds"])
            reached = [c["seconds"] for c in points if c["acc"] >= target]
            first[side].append(reached[0] / 60 if reached else float("inf"))
    assert all(t < float("inf") for times in first.values() for t in times), "a side missed the target: say so"
    ratio, ours, trl, as_trl, low, high = figures(
        row["result"], r"\*\*([\d.]+)x\*\* sooner \(median per seed; ([\d.]+) vs ([\d.]+) min\); "
                       r"ours with TRL's settings ([\d.]+)x \(([\d.]+)-([\d.]+)x\)")
    versus = {side: [t / o for t, o in zip(first["trl"], first[side], strict=True)]
              for side in ("ours", "ours-trl-settings")}
    assert shows(ratio, statistics.median(versus["ours"])) and shows(as_trl, statistics.median(versus["ours-trl-settings"]))
    assert shows(low, min(versus["ours-trl-settings"])) and shows(high, max(versus["ours-trl-settings"]))
    assert shows(ours, statistics.median(first["ours"])) and shows(trl, statistics.median(first["trl"]))
    assert f"{len(seeds)} seeds" in row["measured"]
    cpus = {cpu_name(line.split("CPU: ", 1)[1].split(";")[0])
            for line in (folder / "run.log").read_text().splitlines() if "CPU: " in line}
    assert cpus == {row["cpu"]}, cpus


def check_sampler(row: dict[str, str]) -> None:
    text = (RESULTS / "sampler" / "sampler_bound-47b3162.txt").read_text()
    cells = [c.strip() for c in re.search(r"^\| bfloat16 \| 64 \(64 x 1\) \|(.*)$", text, re.MULTILINE)
             .group(1).strip(" |").split("|")]
    share, ratio = cells[3].rstrip(" %"), cells[5].rstrip("x")
    shown_ratio, shown_share = figures(row["result"], r"\*\*([\d.]+)x\*\*, (\d+) % of the bandwidth bound")
    assert shows(shown_ratio, float(ratio)) and shown_share == share
    assert "float32" in row["measured"] and "weak baseline" in row["result"]
    assert row["cpu"] == EPYC  # docs/results/sampler/README.md: the output records threads, not the CPU


def check_vs_vllm(row: dict[str, str]) -> None:
    data = json.loads((RESULTS / "vs-vllm" / "amd-epyc-all-cores-and-1-thread.json").read_text())
    printed = (RESULTS / "vs-vllm" / "amd-epyc-all-cores-and-1-thread.txt").read_text()
    shown = figures(row["result"], r"\*\*([\d.]+)x / ([\d.]+)x / ([\d.]+)x\*\*; one thread ([\d.]+)x / ([\d.]+)x / "
                                   r"([\d.]+)x; float32 ([\d.]+)-([\d.]+)x")
    at = {(r["threads"], r["dtype"], r["shape"]): r for r in data["rows"]}
    shapes = ("1x1", "64x1", "8x8")
    for printed_ratio, key in zip(shown[:6], [(t, "bfloat16", s) for t in ("2 threads", "1 thread") for s in shapes],
                                  strict=True):
        assert shows(printed_ratio, at[key]["ratios"]["vLLM"])
    float32 = [r["ratios"]["vLLM"] for (_, dtype, _), r in at.items() if dtype == "float32"]
    assert len(float32) == 6 and shows(shown[6], min(float32)) and shows(shown[7], max(float32))
    # equal work: both sides produced exactly max_tokens per sample, and vLLM ran compiled, its default
    for (_, _, shape), r in at.items():
        prompts, samples = map(int, shape.split("x"))
        assert r["dapo-suite"]["tokens"] == r["vLLM"]["tokens"] == prompts * samples * data["max_tokens"] == \
            prompts * samples * 256
    assert "vLLM: vLLM 0.32.0 offline engine, compiled (its default)" in printed
    assert "compiled" in row["measured"] and "256 tokens each side" in row["measured"]
    assert row["cpu"] == cpu_name(data["cpu"])


def check_endpoint(row: dict[str, str]) -> None:
    data = json.loads((RESULTS / "serve" / "vs-vllm-server-amd-epyc-bf16.json").read_text())
    at = {(r["engine"], r["clients"]): r for r in data["rows"]}
    *ratios, ours16, theirs16, ours64, theirs64 = figures(
        row["result"], r"\*\*([\d.]+)x / ([\d.]+)x / ([\d.]+)x\*\* tokens/s; first token p95 ([\d.]+) s vs >= "
                       r"([\d.]+) s at 16 clients \(missed\), ([\d.]+) vs ([\d.]+) s at 64")
    for shown, clients in zip(ratios, (1, 16, 64), strict=True):
        assert shows(shown, at["sampler", clients]["tokens_per_s"] / at["vllm", clients]["tokens_per_s"])
    for shown, engine, clients in ((ours16, "sampler", 16), (theirs16, "vllm", 16), (ours64, "sampler", 64),
                                   (theirs64, "vllm", 64)):
        assert shows(shown, at[engine, clients]["ttft_p95_s"])
    # "missed" and ">=": the sampler's p95 is not lower, and vLLM's is a lower bound (requests still waiting)
    assert at["sampler", 16]["ttft_p95_s"] >= at["vllm", 16]["ttft_p95_s"] and at["vllm", 16]["no_first_token"] > 0
    assert at["sampler", 64]["ttft_p95_s"] < at["vllm", 64]["ttft_p95_s"]
    assert f"{data['windows']} x {data['duration_s']:.0f} s windows" in row["measured"] and "bf16" in row["measured"]
    assert row["cpu"] == cpu_name(data["cpu"])


def check_reward(row: dict[str, str]) -> None:
    folder = RESULTS / "reward"
    throughput = (folder / "throughput.txt").read_text()
    ratio = re.search(r"ratio vs verl math_dapo: ([\d.]+)x", throughput).group(1)
    agreement = (folder / "grader_agreement.txt").read_text()
    false_accepts = {name: int(n) for name, n in
                     re.findall(r"^\| (dapo-suite compute_score|verl math_dapo) \| [^|]+ \| (\d+) \|", agreement,
                                re.MULTILINE)}
    cases = re.search(r"^(\d+) cases", agreement, re.MULTILINE).group(1)
    count = re.search(r"^([\d,]+) responses", throughput, re.MULTILINE).group(1)
    shown_ratio, ours, verl = figures(row["result"], r"\*\*([\d.]+)x\*\* responses/s; (\d+) false accepts \(`math_dapo`: (\d+)\)")
    assert shows(shown_ratio, float(ratio))
    assert int(ours) == false_accepts["dapo-suite compute_score"] and int(verl) == false_accepts["verl math_dapo"]
    assert f"{count} responses" in row["measured"] and f"{cases} grader cases" in row["measured"]
    cpus = {cpu_name(line[5:].split(";")[0]) for text in (throughput, agreement)
            for line in text.splitlines() if line.startswith("CPU: ")}
    assert cpus == {row["cpu"]}, cpus


def check_real_shapes(row: dict[str, str]) -> None:
    folder = RESULTS / "real-shapes"
    small = json.loads((folder / "amd-epyc-step-qwen2.5-0.5b.json").read_text())
    large = json.loads((folder / "amd-epyc-step-qwen2.5-1.5b-mb2.json").read_text())
    rss, speedup = figures(row["result"], r"peak RSS \*\*([\d.]+) GB\*\* \(target 12\); 0\.5B: LoRA's update ([\d.]+)x")
    step = large["shapes"]["qwen2.5-1.5b"]["step"]["lora"]
    assert shows(rss, step["peak_rss"] / 1e9) and int(large["args"]["micro_batch"]) == int(
        figures(row["measured"], r"micro-batch (\d+)")[0])
    assert shows(speedup, small["shapes"]["qwen2.5-0.5b"]["lora_speedup"])
    assert {cpu_name(small["cpu"]), cpu_name(large["cpu"])} == {row["cpu"]}


CHECKS = {
    "demo": check_demo,
    "GSM8K": check_gsm8k,
    "ablation ladder": check_ladder,
    "Clip-Higher": check_entropy,
    "token-level loss": check_token_loss,
    "verl on a CPU": check_verl_cpu,
    "time to accuracy": check_time_to_accuracy,
    "rollout sampler": check_sampler,
    "vs vLLM-CPU": check_vs_vllm,
    "endpoint": check_endpoint,
    "reward": check_reward,
    "real model shapes": check_real_shapes,
}


def test_every_results_row_has_a_check_and_fits_one_screen() -> None:
    rows = results_table()
    assert sorted(rows) == sorted(CHECKS), "a README results row without a check here, or a check without its row"
    assert len(rows) <= 12
    for name, row in rows.items():
        link = re.search(r"\]\(([^)#]+)", row["stage"]).group(1)
        assert (ROOT / link).exists(), f"{name}: {link} is not committed"
        assert len(" | ".join(row.values())) <= 260, f"{name}: the row is too long for one screen"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_readme_figure_is_what_the_committed_output_gives(name: str) -> None:
    CHECKS[name](results_table()[name])


COMMIT_HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


READER_DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
               "docs/results/README.md",
               *sorted(str(p.relative_to(ROOT)) for p in RESULTS.glob("*/README.md"))]  # not the history.md files


@pytest.mark.parametrize("path", READER_DOCS)
def test_no_commit_hash_in_the_reader_docs(path: str) -> None:
    """Commit hashes are history: they belong in docs/results/<topic>/history.md, not in what a reader reads first
    (README.md, docs/*.md, and each results folder's README.md)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    text = re.sub(r"\]\([^)]*\)", "]()", text)  # a link's target may name a file that carries a hash
    assert not COMMIT_HASH.findall(text), COMMIT_HASH.findall(text)
