"""Every figure of the README's results table, recomputed from the raw output committed under docs/results/.

Each row of the table is parsed (its figures as printed) and checked against what the committed files give, at
the precision the row prints: ratios from the two raw rates (or times) behind them, verdicts (met, missed, how
many of how many) from the raw values and the target, tests from the per-seed values, never from a stored
flag, a stored statistic or a printed ratio. The CPU a row names is the one its output records; a row whose
output records none says so. A row without a check here fails, so a new row needs its evidence committed and a
check written; a figure edited by hand, or evidence replaced without the README, fails too
(`test_a_changed_raw_value_fails_its_row`).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

# The short CPU names the table uses, from the CPU line the benchmarks and runs record (the legend above the
# table).
EPYC = "EPYC"  # 2-core AMD EPYC, AVX-512 BF16, no AMX
XEON = "Xeon"  # 2-core Intel Xeon, AVX-512 BF16 and AMX
EPYC_AVX2 = "EPYC (AVX2)"  # 2-core AMD EPYC Zen 3 (family 25 model 1), AVX2 and FMA, no AVX-512
NOT_RECORDED = ", not recorded"  # an output from before the CPU was recorded: the folder's README names it
LONGEST_ROW = 280  # characters a row shows (link targets not counted): one line of a wide screen, or two


def cpu_name(description: str) -> str:
    """EPYC or Xeon (with AVX-512 BF16), from a recorded CPU line; anything else is named in full."""
    flags = description.lower()
    if "avx512_bf16" in flags and "epyc" in flags and "amx" not in flags:
        return EPYC
    if "avx512_bf16" in flags and "xeon" in flags:  # AMX: the runs before AMX was logged do not list it
        return XEON
    if "epyc" in flags and "avx2" in flags and "avx512" not in flags:
        return EPYC_AVX2
    return description


def recorded_cpus(paths: Iterable[Path]) -> set[str]:
    """The CPUs these outputs record: a run's `machine` (config.yaml, config.json, seeds.json) or a
    benchmark's `CPU: ` line (printed, or as `cpu` in its JSON), up to the load average."""
    found: set[str] = set()
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".yaml":  # read as YAML: a long `machine` value is folded onto the next line
            machine = yaml.safe_load(text).get("machine")
            found |= {machine} if machine else set()
        found |= set(re.findall(r'"machine": "([^"]+)"', text))
        found |= set(re.findall(r"CPU: ([^;\"\n]+)", text))
    return found


def check_cpu(row: dict[str, str], outputs: Iterable[Path]) -> None:
    """The row's CPU is the one its outputs record; where they record none, the row says it is not
    recorded."""
    cpus = {cpu_name(description) for description in recorded_cpus(outputs)}
    if cpus:
        assert cpus == set(row["cpu"].split(", ")), (row["cpu"], cpus)
    else:
        assert row["cpu"] in (EPYC + NOT_RECORDED, XEON + NOT_RECORDED), row["cpu"]


def results_table() -> dict[str, dict[str, str]]:
    """The README's results table: one dict per row (stage, measured, result, cpu), keyed by the stage's link
    text."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["stage", "measured", "result", "CPU"], header
    rows = {}
    for line in lines[2:]:
        cells = dict(
            zip(
                [name.lower() for name in header],
                (cell.strip() for cell in line.strip().strip("|").split(" | ")),
                strict=True,
            )
        )
        name = re.match(r"\[([^\]]+)\]", cells["stage"])
        assert name, f"a results row without a link to its evidence: {line}"
        rows[name.group(1)] = cells
    return rows


def decimals(printed: str) -> int:
    return len(printed.split(".")[1]) if "." in printed else 0


def shows(printed: str, value: float) -> bool:
    """True when `printed` is `value` rounded to the decimals printed (either neighbour at an exact half); in
    e-notation (8.5e-06), to its mantissa's decimals."""
    mantissa, _, exponent = printed.partition("e")
    return abs(float(printed) - value) <= 0.5 * 10 ** (int(exponent or 0) - decimals(mantissa)) + 1e-12


def shows_ratio(printed: str, numerator: str, denominator: str, scale: float = 1.0) -> bool:
    """True when `printed` is `scale` x the ratio of two values recorded only as printed (`numerator`,
    `denominator`): some pair of values that print as those two gives a figure that prints as `printed`."""

    def bounds(value: str) -> tuple[float, float]:
        half = 0.5 * 10 ** -decimals(value)
        return float(value) - half, float(value) + half

    (top_low, top_high), (bottom_low, bottom_high) = bounds(numerator), bounds(denominator)
    tolerance = 0.5 * 10 ** -decimals(printed) + 1e-9
    return (
        scale * top_low / bottom_high - tolerance
        <= float(printed)
        <= scale * top_high / bottom_low + tolerance
    )


def figures(cell: str, pattern: str) -> tuple[str, ...]:
    found = re.search(pattern, cell)
    assert found, f"expected {pattern!r} in the README cell: {cell}"
    return found.groups()


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_demo(row: dict[str, str]) -> None:
    from dapo_suite.demo import meets_demo_target

    seeds = RESULTS / "demo" / "seeds.json"
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
        assert int(met) == sum(meets_demo_target(run["before"], run["after"]) for run in runs), arm
    assert {run["arm"] for run in data["runs"]} == {arm for arm, *_ in shown}  # no arm left out of the row
    check_cpu(row, [seeds])


def check_gsm8k(row: dict[str, str]) -> None:
    from eval.compare import compare_runs

    folder = RESULTS / "gsm8k"
    # `eval compare` run again on the committed generations (its bootstrap is seeded)
    gsm8k = compare_runs(folder / "eval" / "gsm8k-before", folder / "eval" / "gsm8k-after")
    math500 = compare_runs(folder / "eval" / "math500-before", folder / "eval" / "math500-after")
    before, after, delta, low, high, m_before, m_after = figures(
        row["result"],
        r"([\d.]+) -> \*\*([\d.]+) %\*\* \(\+([\d.]+) points, CI \+([\d.]+) to \+([\d.]+)\); "
        r"MATH-500 ([\d.]+) -> ([\d.]+) %",
    )
    assert shows(before, 100 * gsm8k["avg_a"]) and shows(after, 100 * gsm8k["avg_b"])
    assert shows(delta, 100 * (gsm8k["avg_b"] - gsm8k["avg_a"]))
    assert shows(low, 100 * gsm8k["bootstrap"]["ci95"][0]) and shows(
        high, 100 * gsm8k["bootstrap"]["ci95"][1]
    )
    assert shows(m_before, 100 * math500["avg_a"]) and shows(m_after, 100 * math500["avg_b"])
    assert f"({gsm8k['shared_problems']:,})" in row["measured"]
    check_cpu(row, [*folder.glob("eval/*/config.json"), *folder.glob("train/*/config.yaml")])


def check_effect(
    technique: str, study: str = "effects", treatment: str = "dapo", control: str | None = None
) -> Callable[[dict[str, str]], None]:
    """A technique's row of a paired study (the DAPO-effects study; the tool study, whose `treatment` arm is
    dapo-tool): its verdict (shown: paired t-test p < 0.05 with the mean difference in the paper's direction,
    as pre-registered), the medians of its pre-registered figure with and without it, the seeds that moved the
    paper's way and p, recomputed from the committed per-run metrics. With `control` (a study folder of the
    same technique rerun), the row's "(control): verdict, X vs Y %, p P" is recomputed from it too."""

    def check(row: dict[str, str]) -> None:
        from dapo_suite.train.effects import effects_results

        result = effects_results(RESULTS / study)["techniques"][technique]
        primary = result["figures"][0]
        verdict, with_it, without, unit, agree, seeds, p = figures(
            row["result"],
            r"^\*\*(shown|not shown)\*\*: ([\d.]+) vs ([\d.]+) ?(%|nats|tokens)? \(medians\), "
            r"(\d+) of (\d+) seeds the paper's way, p ([\d.]+(?:e-\d+)?)",
        )
        scale = 100 if unit == "%" else 1
        assert shows(with_it, scale * statistics.median(primary["dapo"]))
        assert shows(without, scale * statistics.median(primary["arm"]))
        sign = 1 if primary["dapo_higher_expected"] else -1
        differences = [d - a for d, a in zip(primary["dapo"], primary["arm"], strict=True)]
        assert (int(agree), int(seeds)) == (sum(sign * d > 0 for d in differences), len(differences))
        assert (
            int(seeds) >= 5 and f"{seeds} seeds x 60 steps" in row["measured"]
        )  # the pre-registered minimum
        p_value = primary["t_test"]["p_value"]
        assert shows(p, p_value)
        shown = p_value < 0.05 and sign * statistics.fmean(differences) > 0
        assert verdict == ("shown" if shown else "not shown"), (verdict, p_value)
        outputs = [
            path
            for folder in (study, *([control] if control else []))
            for arm in (treatment, result["arm"])
            for path in (RESULTS / folder / arm).glob("seed-*/config.yaml")
        ]
        if control:
            controlled = effects_results(RESULTS / control)["techniques"][technique]["figures"][0]
            verdict, with_it, without, p = figures(
                row["result"], r"\(control\): (shown|not shown), ([\d.]+) vs ([\d.]+) %, p ([\d.]+)"
            )
            assert shows(with_it, 100 * statistics.median(controlled["dapo"]))
            assert shows(without, 100 * statistics.median(controlled["arm"]))
            assert shows(p, controlled["t_test"]["p_value"])
            mean = statistics.fmean(d - a for d, a in zip(controlled["dapo"], controlled["arm"], strict=True))
            shown = controlled["t_test"]["p_value"] < 0.05 and mean > 0
            assert verdict == ("shown" if shown else "not shown")
        check_cpu(row, outputs)

    return check


def check_verl_cpu(row: dict[str, str]) -> None:
    def merged(side: str) -> dict[int, dict]:
        steps: dict[int, dict] = {}
        for record in jsonl(RESULTS / "verl-cpu" / side / "metrics.jsonl"):
            steps.setdefault(int(record["step"]), {}).update(record)
        return steps

    verl, ours = merged("verl"), merged("embedded")
    v0, v3, e0, e3, faster = figures(
        row["result"],
        r"verl ([\d.]+) -> ([\d.]+) %, embedded ([\d.]+) -> ([\d.]+) %\); embedded ([\d.]+)x faster",
    )
    assert shows(v0, 100 * verl[0]["val/acc"]) and shows(v3, 100 * verl[3]["val/acc"])
    assert shows(e0, 100 * ours[0]["val/acc"]) and shows(e3, 100 * ours[3]["val/acc"])
    seconds = {
        name: sum(s["perf/step_seconds"] for s in steps.values() if "perf/step_seconds" in s)
        for name, steps in (("verl", verl), ("embedded", ours))
    }
    assert shows(faster, seconds["verl"] / seconds["embedded"])
    check_cpu(row, (RESULTS / "verl-cpu").glob("*/config.yaml"))


def check_time_to_accuracy(row: dict[str, str]) -> None:
    folder = RESULTS / "time-to-accuracy"
    curves = jsonl(folder / "curves.jsonl")
    target = 0.5
    assert "to 50 % held-out" in row["measured"]
    seeds = sorted({c["seed"] for c in curves})
    first: dict[str, list[float]] = {}  # minutes to the target per seed; never: beyond any time
    for side in ("ours", "ours-trl-settings", "trl"):
        first[side] = []
        for seed in seeds:
            points = sorted(
                (c for c in curves if c["side"] == side and c["seed"] == seed), key=lambda c: c["seconds"]
            )
            reached = [c["seconds"] for c in points if c["acc"] >= target]
            first[side].append(reached[0] / 60 if reached else float("inf"))
    assert all(t < float("inf") for times in first.values() for t in times), (
        "a side missed the target: say so"
    )
    ratio, ours, trl, as_trl, trl_low, trl_high, low, high, every = figures(
        row["result"],
        r"\*\*([\d.]+)x\*\* sooner \(median per seed; ([\d.]+) vs ([\d.]+) min\), with TRL's settings "
        r"([\d.]+)x: the time per batch, TRL's `generate` \+ update (\d+)-(\d+) s vs (\d+)-(\d+) s; "
        r"evaluated every (batch|\d+ batches)",
    )
    versus = {
        side: [t / o for t, o in zip(first["trl"], first[side], strict=True)]
        for side in ("ours", "ours-trl-settings")
    }
    assert shows(ratio, statistics.median(versus["ours"])) and shows(
        as_trl, statistics.median(versus["ours-trl-settings"])
    )
    assert shows(ours, statistics.median(first["ours"])) and shows(trl, statistics.median(first["trl"]))
    # a batch's time: each evaluation's training seconds over the batches before it
    per_batch = {
        side: [c["seconds"] / c["batches"] for c in curves if c["side"] == side and c["batches"]]
        for side in ("trl", "ours-trl-settings")
    }
    assert shows(trl_low, min(per_batch["trl"])) and shows(trl_high, max(per_batch["trl"]))
    assert shows(low, min(per_batch["ours-trl-settings"])) and shows(
        high, max(per_batch["ours-trl-settings"])
    )
    every = 1 if every == "batch" else int(every.split()[0])
    assert {c["batches"] for c in curves} == set(range(0, max(c["batches"] for c in curves) + 1, every))
    assert f"{len(seeds)} seeds" in row["measured"]
    # TRL's precision as its runs printed it: bf16 autocast, as ours (`auto` on a CPU with native bf16)
    precisions = re.findall(
        r"^\[trl seed (\d)\] torch .*, (bf16 autocast|float32)$",
        (folder / "run.log").read_text(),
        re.MULTILINE,
    )
    assert {int(seed) for seed, _ in precisions} == set(seeds) and {p for _, p in precisions} == {
        "bf16 autocast"
    }
    assert "bf16" in row["measured"]
    check_cpu(row, [folder / "run.log", folder / "curves.jsonl"])


def check_sampler(row: dict[str, str]) -> None:
    output = RESULTS / "sampler" / "sampler_bound-47b3162.txt"
    cells = [
        c.strip()
        for c in re.search(r"^\| bfloat16 \| 64 \(64 x 1\) \|(.*)$", output.read_text(), re.MULTILINE)
        .group(1)
        .strip(" |")
        .split("|")
    ]
    rate, bound, generate = cells[1], cells[2], cells[4]
    shown_ratio, shown_share = figures(row["result"], r"\*\*([\d.]+)x\*\*, (\d+) % of the bandwidth bound")
    assert shows_ratio(shown_ratio, rate, generate) and shows_ratio(shown_share, rate, bound, scale=100)
    assert "float32" in row["measured"] and "weak baseline" in row["result"]
    check_cpu(row, [output])


def update_shares(path: Path, dtype: str = "float32") -> dict[str, tuple[float, float]]:
    """benchmarks/update_flops.py's printed rows of `dtype`: shape -> (update GFLOP/s, its share of the matmul
    peak)."""
    found = re.findall(
        rf"^\[(\w+) {dtype}\] update ([\d.]+) GFLOP/s .* update/peak ([\d.]+)", path.read_text(), re.M
    )
    return {shape: (float(rate), float(share)) for shape, rate, share in found}


def trl_ratio(path: Path) -> float:
    """benchmarks/train_step.py's printed ratio of our update's tokens/s to TRL's."""
    return float(figures(path.read_text(), r"ratio ours / TRL = ([\d.]+)x")[0])


def check_update_flops(row: dict[str, str]) -> None:
    folder = RESULTS / "update-flops"
    shares = {
        dtype: update_shares(folder / "amd-epyc-zen4-after-all.txt", dtype)
        for dtype in ("bfloat16", "float32")
    }
    bf16_demo, bf16_effects, target, demo, effects, met = figures(
        row["result"],
        r"bf16 \*\*([\d.]+) / ([\d.]+)\*\* of its peak \(([\d.]+): missed\), float32 ([\d.]+) / ([\d.]+) "
        r"\(met at the (\w+)'s shape only\)",
    )
    assert shows(bf16_demo, shares["bfloat16"]["demo"][1]) and shows(
        bf16_effects, shares["bfloat16"]["effects"][1]
    )
    assert shows(demo, shares["float32"]["demo"][1]) and shows(effects, shares["float32"]["effects"][1])
    assert max(shares["bfloat16"]["demo"][1], shares["bfloat16"]["effects"][1]) < float(target)
    assert [shape for shape, (_, share) in shares["float32"].items() if share >= float(target)] == [met]
    runs = {dtype: folder / f"amd-epyc-zen4-train-step-{dtype}.txt" for dtype in ("float32", "bf16")}
    float32, bf16_ratio, trl_target = figures(
        row["result"], r"\*\*([\d.]+)x\*\* TRL's tokens/s in float32, ([\d.]+)x in bf16 \(([\d.]+)x: missed\)"
    )
    assert shows(float32, trl_ratio(runs["float32"])) and shows(bf16_ratio, trl_ratio(runs["bf16"]))
    assert max(trl_ratio(runs["float32"]), trl_ratio(runs["bf16"])) < float(trl_target)
    assert "bf16 autocast" in runs["bf16"].read_text() and ", float32\n" in runs["float32"].read_text()
    assert "2 threads" in row["measured"]
    check_cpu(row, [folder / "amd-epyc-zen4-after-all.txt", *runs.values()])


def llamacpp_table(output: Path) -> dict[tuple[str, int], tuple[float, int, str]]:
    """(dtype, rows) -> (ratio, the sampler's share of the bound, the target's verdict), 2 threads, of a
    benchmarks/vs_llamacpp.py output."""
    return {
        (dtype, int(rows)): (float(ratio), int(share), verdict)
        for dtype, rows, share, ratio, verdict in re.findall(
            r"^(int\d)\s+(\d+)x1 t2: decode dapo-suite\s+[\d.]+ tok/s \(\s*(\d+) % of bound\).*?: "
            r"([\d.]+)x \(target [\d.]+x: (met|missed)\)",
            output.read_text(),
            re.M,
        )
    }


def check_int8_rollouts(row: dict[str, str]) -> None:
    folder = RESULTS / "quantized-rollouts"
    output, bf16_cache = (
        folder / f"amd-epyc-zen4-vs-llamacpp-int8-int4{suffix}.txt" for suffix in ("", "-kv-bf16")
    )
    table, bf16_table = llamacpp_table(output), llamacpp_table(bf16_cache)
    int8 = figures(row["result"], r"int8 / Q8_0 \**([\d.]+)x\** / ([\d.]+)x / ([\d.]+)x")
    int4 = figures(row["result"], r"int4 / Q4_0 ([\d.]+)x / ([\d.]+)x / ([\d.]+)x with bf16 KV")
    for shown, dtype, source in ((int8, "int8", table), (int4, "int4", bf16_table)):
        for printed, rows in zip(shown, (1, 8, 64), strict=True):
            assert shows(printed, source[dtype, rows][0]), (dtype, rows)
    assert all(table["int8", rows][2] == "met" for rows in (1, 8, 64))
    # int4's misses: at 8 rows with either cache, at 64 with the float32 one
    assert [bf16_table["int4", rows][2] for rows in (1, 8, 64)] == ["met", "missed", "met"]
    assert [table["int4", rows][2] for rows in (1, 8, 64)] == ["met", "missed", "missed"]
    assert "(2x missed at 8; float32 KV: 8, 64)" in row["result"]
    assert "--kv-cache-dtype bfloat16" in (folder / "README.md").read_text()
    (share,) = figures(row["result"], r"(\d+) % of bound at 1 row \(80 %: missed\)")
    assert int(share) == table["int8", 1][1] < 80
    assert "1 / 8 / 64 rows" in row["measured"] and "2 threads" in row["measured"]
    from dapo_suite.demo import meets_demo_target

    seeds = RESULTS / "quantized-rollouts" / "seeds.json"
    runs = json.loads(seeds.read_text())["runs"]
    met, total = figures(row["result"], r"demo \*\*(\d+) of (\d+)\*\* seeds met")
    assert {run["arm"] for run in runs} == {"int8-rollouts"} and int(total) == len(runs)
    assert int(met) == sum(meets_demo_target(run["before"], run["after"]) for run in runs)
    check_cpu(row, [output, bf16_cache, seeds])


def tokens_per_s(side: dict) -> float:
    return side["tokens"] / side["seconds"]


def check_vs_vllm(row: dict[str, str]) -> None:
    output = RESULTS / "vs-vllm" / "amd-epyc-all-cores-and-1-thread.json"
    data = json.loads(output.read_text())
    printed = (RESULTS / "vs-vllm" / "amd-epyc-all-cores-and-1-thread.txt").read_text()
    shown = figures(
        row["result"],
        r"\*\*([\d.]+)x / ([\d.]+)x / ([\d.]+)x\*\*; one thread ([\d.]+)x / ([\d.]+)x / "
        r"([\d.]+)x; float32 ([\d.]+)-([\d.]+)x",
    )
    at = {(r["threads"], r["dtype"], r["shape"]): r for r in data["rows"]}
    ratio = {key: tokens_per_s(r["dapo-suite"]) / tokens_per_s(r["vLLM"]) for key, r in at.items()}
    shapes = ("1x1", "64x1", "8x8")
    for printed_ratio, key in zip(
        shown[:6], [(t, "bfloat16", s) for t in ("2 threads", "1 thread") for s in shapes], strict=True
    ):
        assert shows(printed_ratio, ratio[key])
    float32 = [value for (_, dtype, _), value in ratio.items() if dtype == "float32"]
    assert len(float32) == 6 and shows(shown[6], min(float32)) and shows(shown[7], max(float32))
    # equal work: both sides produced exactly max_tokens per sample, and vLLM ran compiled, its default
    for (_, _, shape), r in at.items():
        prompts, samples = map(int, shape.split("x"))
        assert (
            r["dapo-suite"]["tokens"]
            == r["vLLM"]["tokens"]
            == prompts * samples * data["max_tokens"]
            == prompts * samples * 256
        )
    assert "vLLM: vLLM 0.32.0 offline engine, compiled (its default)" in printed
    assert "compiled" in row["measured"] and "256 tokens each side" in row["measured"]
    check_cpu(row, [output])


def check_neighbour(row: dict[str, str]) -> None:
    outputs = sorted((RESULTS / "vs-vllm").glob("amd-epyc-*-neighbour*.json"))
    low, high, missed, runs = figures(
        row["result"],
        r"sampler \*\*([\d.]+)-([\d.]+)x\*\* its one-thread speed "
        r"\(>= 1x: missed in (\d) of (\d)\)",
    )
    ratios, vllm_defaults, unanswered = [], [], 0
    for output in outputs:
        at = {(r["threads"], r["shape"]): r for r in json.loads(output.read_text())["rows"]}
        for shape in {shape for _, shape in at}:
            default, pinned = at["default", shape], at["1 thread", shape]
            ratios.append(tokens_per_s(default["dapo-suite"]) / tokens_per_s(pinned["dapo-suite"]))
            if "vLLM" in default:
                vllm_defaults.append(tokens_per_s(default["vLLM"]))
            unanswered += any("no answer within 400 s" in why for why in default["failed"].values())
    assert shows(low, min(ratios)) and shows(high, max(ratios)) and int(runs) == len(ratios)
    assert int(missed) == sum(ratio < 1 for ratio in ratios)
    collapsed, limit = figures(row["result"], r"vLLM collapses \(([\d.]+) tok/s or no answer in (\d+) s\)")
    assert [shows(collapsed, rate) for rate in vllm_defaults] == [True] and unanswered and limit == "400"
    check_cpu(row, outputs)


LLAMACPP_LINE = re.compile(
    r"^(float32|bfloat16)\s+(\d+)x(\d+) t(\d): decode dapo-suite\s+([\d.]+) tok/s .*?, "
    r"llama\.cpp (f32|bf16)\s+([\d.]+) tok/s",
    re.MULTILINE,
)


def check_llamacpp(row: dict[str, str]) -> None:
    outputs = sorted((RESULTS / "llamacpp").glob("amd-epyc-*.txt"))
    # decode rates as printed, sampler and llama.cpp at the same precision (the Q4_1 rows are extra)
    rates = {
        (dtype, int(prompts), int(threads)): (ours, theirs)
        for output in outputs
        for dtype, prompts, samples, threads, ours, _, theirs in LLAMACPP_LINE.findall(output.read_text())
        if samples == "1"
    }
    (
        one_low,
        one_high,
        eight_low,
        eight_high,
        eight_met,
        eight_of,
        many_low,
        many_high,
        many_missed,
        many_of,
    ) = figures(
        row["result"],
        r"1 row \*\*([\d.]+)-([\d.]+)x\*\* \(1\.1x: missed\); 8 rows ([\d.]+)-([\d.]+)x \(2x met in "
        r"(\d) of (\d)\); 64 rows \*\*([\d.]+)-([\d.]+)x\*\* \(2x missed in (\d) of (\d)\)",
    )
    for rows, low, high, target in (
        (1, one_low, one_high, 1.1),
        (8, eight_low, eight_high, 2.0),
        (64, many_low, many_high, 2.0),
    ):
        pairs = [pair for (_, prompts, _), pair in rates.items() if prompts == rows]
        assert len(pairs) == 4, rows  # f32 and bf16, 2 threads and 1
        by_ratio = sorted(pairs, key=lambda pair: float(pair[0]) / float(pair[1]))
        assert shows_ratio(low, *by_ratio[0]) and shows_ratio(high, *by_ratio[-1]), rows
        met = sum(float(ours) >= target * float(theirs) for ours, theirs in pairs)
        if rows == 1:
            assert met == 0, "one row: a met target is not 'missed'"
        elif rows == 8:
            assert (met, len(pairs)) == (int(eight_met), int(eight_of))
        else:
            assert (len(pairs) - met, len(pairs)) == (int(many_missed), int(many_of))
    check_cpu(row, outputs)


ENDPOINT_RUNS = {
    "pinned": ("vs-vllm-server-pinned-amd-epyc-bf16.json", "0", "1"),
    "2 cores": ("vs-vllm-server-all-cores-amd-epyc-bf16.json", "0-1", "0-1"),
}


def check_endpoint(row: dict[str, str]) -> None:
    """Both re-measures: each server pinned to one core with the clients on the other, and all on both
    cores."""
    outputs = []
    for label, (name, server_cores, client_cores) in ENDPOINT_RUNS.items():
        output = RESULTS / "serve" / name
        outputs.append(output)
        data = json.loads(output.read_text())
        assert (data["server_cores"], data["client_cores"]) == (server_cores, client_cores), label
        at = {(r["engine"], r["clients"]): r for r in data["rows"]}
        ratios = figures(row["result"], re.escape(label) + r" \*\*([\d.]+)x / ([\d.]+)x / ([\d.]+)x\*\*")
        for shown, clients in zip(ratios, (1, 16, 64), strict=True):
            rate = {
                engine: at[engine, clients]["tokens"] / at[engine, clients]["window_s"]
                for engine in ("sampler", "vllm")
            }
            assert shows(shown, rate["sampler"] / rate["vllm"]), (label, clients)
        # "lower first-token p95 at 16 and 64": the sampler's median-window p95 below vLLM's, in both runs
        assert all(at["sampler", c]["ttft_p95_s"] < at["vllm", c]["ttft_p95_s"] for c in (16, 64)), label
        assert f"{data['windows']} x {data['duration_s']:.0f} s windows" in row["measured"]
    assert "lower first-token p95 at 16 and 64" in row["result"] and "bf16" in row["measured"]
    failed, requests = figures(row["result"], r"(\d+) of ([\d,]+) requests failed")
    totals = [
        (r["failed_requests_total"], r["requests_total"])
        for output in outputs
        for r in json.loads(output.read_text())["rows"]
    ]
    assert (int(failed), int(requests.replace(",", ""))) == tuple(map(sum, zip(*totals, strict=True)))
    check_cpu(row, outputs)


def check_reward(row: dict[str, str]) -> None:
    """The ratio of the median times and its range over the repeats, from each repeat's printed seconds."""
    folder = RESULTS / "reward"
    throughput = (folder / "throughput.txt").read_text()
    repeats = [
        (float(ours), float(verl))
        for ours, verl in re.findall(
            r"^  repeat \d+/\d+: dapo_suite compute_score ([\d.]+) s = [\d,]+/s, verl math_dapo ([\d.]+) s",
            throughput,
            re.MULTILINE,
        )
    ]
    agreement = (folder / "grader_agreement.txt").read_text()
    false_accepts = {
        name: int(n)
        for name, n in re.findall(
            r"^\| (dapo-suite compute_score|verl math_dapo) \| [^|]+ \| (\d+) \|", agreement, re.MULTILINE
        )
    }
    cases = re.search(r"^(\d+) cases", agreement, re.MULTILINE).group(1)
    count = re.search(r"^([\d,]+) responses", throughput, re.MULTILINE).group(1)
    shown_ratio, low, high, target, ours, verl = figures(
        row["result"],
        r"\*\*([\d.]+)x\*\* responses/s \(median; repeats ([\d.]+)-([\d.]+)x; >= ([\d.]+)x: met\); "
        r"(\d+) false accepts \(`math_dapo`: (\d+)\)",
    )
    assert len(repeats) >= 5
    ours_s, verl_s = zip(*repeats, strict=True)
    assert shows(shown_ratio, statistics.median(verl_s) / statistics.median(ours_s))
    per_repeat = [v / o for o, v in repeats]
    assert shows(low, min(per_repeat)) and shows(high, max(per_repeat))
    assert statistics.median(verl_s) / statistics.median(ours_s) >= float(target)
    assert (
        int(ours) == false_accepts["dapo-suite compute_score"]
        and int(verl) == false_accepts["verl math_dapo"]
    )
    assert f"{count} responses" in row["measured"] and f"{len(repeats)} repeats" in row["measured"]
    assert f"{cases} grader cases" in row["measured"]
    check_cpu(row, [folder / "throughput.txt", folder / "grader_agreement.txt"])


def check_real_shapes(row: dict[str, str]) -> None:
    folder = RESULTS / "real-shapes"
    small = json.loads((folder / "amd-epyc-step-qwen2.5-0.5b.json").read_text())
    large = json.loads((folder / "amd-epyc-step-qwen2.5-1.5b-mb2.json").read_text())
    sampler = json.loads((folder / "amd-epyc-sampler.json").read_text())
    rss, target, speedup, shapes_missed, shapes = figures(
        row["result"],
        r"peak RSS \*\*([\d.]+) GB\*\* \(target (\d+): met\); 0\.5B LoRA update ([\d.]+)x full's "
        r"\(1\.5x: missed\); sampler 2x transformers at 64 rows: missed on (\d) of (\d)",
    )
    step = large["shapes"]["qwen2.5-1.5b"]["step"]["lora"]
    assert shows(rss, step["peak_rss"] / 1e9) and step["peak_rss"] < int(target) * 1e9
    assert int(large["args"]["micro_batch"]) == int(figures(row["measured"], r"micro-batch (\d+)")[0])
    update = small["shapes"]["qwen2.5-0.5b"]["step"]
    lora_speedup = update["full"]["update_seconds"] / update["lora"]["update_seconds"]
    assert shows(speedup, lora_speedup) and lora_speedup < 1.5
    # the sampler against transformers' step at 64 rows: the same work, so the ratio of the best times
    at_64 = [
        next(r for r in shape["sampler"]["rows"] if r["rows"] == 64) for shape in sampler["shapes"].values()
    ]
    ratios = [min(r["seconds"]["hf"]) / min(r["seconds"]["fast"]) for r in at_64]
    assert (int(shapes_missed), int(shapes)) == (sum(ratio < 2 for ratio in ratios), len(ratios))
    assert f"sampler at {len(ratios)} shapes" in row["measured"]
    check_cpu(
        row,
        [
            folder / "amd-epyc-step-qwen2.5-0.5b.json",
            folder / "amd-epyc-step-qwen2.5-1.5b-mb2.json",
            folder / "amd-epyc-sampler.json",
        ],
    )


CHECKS = {
    "demo": check_demo,
    "GSM8K": check_gsm8k,
    "Clip-Higher": check_effect("clip-higher"),
    "dynamic sampling": check_effect("dynamic sampling", control="effects/guard-control"),
    "token-level loss": check_effect("token-level loss"),
    "overlong handling": check_effect("overlong handling"),
    "Python tool": check_effect("Python tool", "tools", "dapo-tool"),
    "verl on a CPU": check_verl_cpu,
    "time to accuracy": check_time_to_accuracy,
    "rollout sampler": check_sampler,
    "vs vLLM-CPU": check_vs_vllm,
    "beside another program": check_neighbour,
    "vs llama.cpp": check_llamacpp,
    "endpoint": check_endpoint,
    "reward": check_reward,
    "real model shapes": check_real_shapes,
    "DAPO update": check_update_flops,
    "int8 rollouts": check_int8_rollouts,
}


def test_every_results_row_has_a_check_and_fits_one_screen() -> None:
    rows = results_table()
    assert sorted(rows) == sorted(CHECKS), (
        "a README results row without a check here, or a check without its row"
    )
    for name, row in rows.items():
        link = re.search(r"\]\(([^)#]+)", row["stage"]).group(1)
        assert (ROOT / link).exists(), f"{name}: {link} is not committed"
        shown = re.sub(r"\]\([^)]*\)", "]", " | ".join(row.values()))
        assert len(shown) <= LONGEST_ROW, (
            f"{name}: the row is too long for one screen ({len(shown)} characters)"
        )


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_readme_figure_is_what_the_committed_output_gives(name: str) -> None:
    CHECKS[name](results_table()[name])


def test_a_changed_raw_value_fails_its_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks read the raw values, not the README's copy of them: LoRA's update made 10 % faster in a copy
    of its output, under the same README, fails the real-shapes row."""
    copy = tmp_path / "real-shapes"
    shutil.copytree(RESULTS / "real-shapes", copy)
    output = copy / "amd-epyc-step-qwen2.5-0.5b.json"
    data = json.loads(output.read_text())
    data["shapes"]["qwen2.5-0.5b"]["step"]["lora"]["update_seconds"] *= 0.9
    output.write_text(json.dumps(data))
    row = results_table()["real model shapes"]
    check_real_shapes(row)  # the committed output passes
    monkeypatch.setattr(sys.modules[__name__], "RESULTS", tmp_path)
    with pytest.raises(AssertionError):
        check_real_shapes(row)


def test_a_changed_run_of_the_effects_study_fails_its_technique_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The technique rows are recomputed from each run's metrics.jsonl: DAPO's entropy over steps 51-60
    tripled in one seed of a copy of the study, under the same README, fails the Clip-Higher row, and the
    dynamic-sampling row, which does not read entropy, still passes on the copy."""
    copy = tmp_path / "effects"
    shutil.copytree(RESULTS / "effects", copy, ignore=shutil.ignore_patterns("*.png", "h200"))
    metrics = copy / "dapo" / "seed-0" / "metrics.jsonl"
    records = jsonl(metrics)
    for record in records:
        if 51 <= record["step"] <= 60 and "actor/entropy" in record:
            record["actor/entropy"] *= 3
    metrics.write_text("".join(json.dumps(record) + "\n" for record in records))
    rows = results_table()
    monkeypatch.setattr(sys.modules[__name__], "RESULTS", tmp_path)
    with pytest.raises(AssertionError):
        CHECKS["Clip-Higher"](rows["Clip-Higher"])
    CHECKS["dynamic sampling"](rows["dynamic sampling"])


COMMIT_HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


READER_DOCS = [
    "README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
    "docs/results/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in RESULTS.glob("*/README.md")),
]  # not the history.md files


@pytest.mark.parametrize("path", READER_DOCS)
def test_no_commit_hash_in_the_reader_docs(path: str) -> None:
    """Commit hashes are history: they belong in docs/results/<topic>/history.md, not in what a reader reads
    first (README.md, docs/*.md, and each results folder's README.md)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    text = re.sub(r"\]\([^)]*\)", "]()", text)  # a link's target may name a file that carries a hash
    assert not COMMIT_HASH.findall(text), COMMIT_HASH.findall(text)
