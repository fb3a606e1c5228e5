"""Symbolic answer equivalence (math-verify's LaTeX parser and comparison) with verdicts that do not depend on
load.

Two processes: the caller's `SymbolicChecker`, and one long-lived worker,
`python -m dapo_suite.core.symbolic`.

- The worker imports sympy and math-verify, then runs `WARM_UP` (one pair of each kind: fractions, tuples,
  intervals, sets, equations, relations, matrices) before it says `ready`: sympy imports and builds caches
  lazily, so a cold first comparison of a tuple or an equation would spend most of its budget warming up.
- It never compares anything itself: each request is computed in a child forked from it, so every comparison
  starts from the same warm state, a pathological one is killed (SIGKILL: a C-level big-integer power ignores
  signals) without costing the warm process, and the next request is served at once.
- **Work first, time last.** Before comparing, the child parses both answers without evaluating them and
  bounds the work they imply (`exceeds_work_bound`: the digits of any exact number they denote, the degree of
  any power of a symbol, their size): past a bound the verdict is `too_complex`, the same on any machine at
  any load. Only what passes is compared, under a CPU budget (`cpu_limit_s`, twice the slowest comparison
  measured, which a busy machine does not change: it slows the clock, not the CPU bill) and, as a last resort,
  a wall-clock cap (`wall_limit_s`, far above what a comparison takes even at a load of 8 on 2 cores). Running
  out of either is `timeout`. Neither is ever a silent "wrong": the reward counts them (`reward/too_complex`,
  `reward/timeouts`). A timeout is not retried, since it would take the same CPU again. If the worker process
  itself fails (dies, or stops answering), the call is retried once on a fresh worker, which warms up before
  it serves.

math-verify's own timeout uses SIGALRM, which works only on the main thread; here the limit holds from any
thread. Only the LaTeX grammar parses model text: math-verify's plain-expression path goes through sympy's
`parse_expr`, which calls `eval`.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading

# Last resorts behind the work bound (docs/eval.md, "Symbolic limits"): four times the CPU of the slowest
# comparison measured, and a wall cap that a load of 8 on 2 cores stays far below.
SYMBOLIC_CPU_LIMIT_S = 2.0
SYMBOLIC_WALL_LIMIT_S = 30.0
# The work bound: an answer past any of these is `too_complex` before it is compared.
MAX_EXACT_DIGITS = 10_000  # decimal digits of an exact number (1/2006!, in the warm-up, has 5,760)
MAX_SYMBOLIC_DEGREE = 256  # the largest power of an expression with symbols (x^{256})
MAX_EXPRESSION_NODES = 600  # nodes of the unevaluated expression tree
MAX_TERMS = 10_000  # terms of a sum or product written with \sum or \prod
MAX_NESTING = 24  # brackets and braces inside each other, checked before parsing (ANTLR slows with depth)
COMPARISONS = ("equal", "different", "timeout", "too_complex")  # what `SymbolicChecker.compare` returns
CPU_POLL_S = 0.02  # how often the worker reads a comparison's CPU time (/proc has 10 ms resolution)
STARTUP_TIMEOUT_S = 180.0  # importing sympy and math-verify and warming up, on a loaded 2-core machine
MEMORY_LIMIT_BYTES = (
    2 * 1024**3
)  # per comparison: a runaway expression is stopped before it can swap the machine
ORPHAN_CPU_LIMIT_S = 5  # per comparison: ends a child whose worker vanished before killing it
# the worker answers `timeout` itself; past the wall limit + margin it is stuck and replaced
REPLY_MARGIN_S = 1.0

# one of each construct MATH answers use (none is a MATH-500 answer: the timing measurement stays fair)
WARM_UP = [
    ("\\frac{1}{2}", "0.5"),
    ("3\\sqrt{2}", "\\sqrt{18}"),
    ("\\frac{3\\sqrt{3}}{4}", "\\frac34\\sqrt3"),
    ("1\\frac{3}{4}", "\\frac{7}{4}"),
    ("(3, \\frac{\\pi}{4})", "\\left( 3, \\frac{\\pi}{4} \\right)"),
    ("\\left( \\frac{5}{2}, -7 \\right)", "(2.5, -7)"),
    ("(2, -3, 5, 17)", "(2,-3,5,17)"),
    ("(-\\sqrt{2}, \\sqrt{2})", "\\left(-\\sqrt2, \\sqrt2\\right)"),
    ("\\left[ \\frac{\\pi}{4}, \\frac{3 \\pi^2}{2} \\right]", "[\\frac{\\pi}{4}, \\frac{3\\pi^2}{2}]"),
    ("[-2, 7)", "[-2,7)"),
    ("(-\\infty, 1] \\cup (2, \\infty)", "(-\\infty,1]\\cup(2,\\infty)"),
    ("x \\in [-3, 5]", "[-3, 5]"),
    ("3, 5, 7", "\\{7, 5, 3\\}"),
    ("-3,2", "2, -3"),
    ("\\{1\\pm\\sqrt{2},-3\\}", "\\{-3, 1+\\sqrt2, 1-\\sqrt2\\}"),
    ("2x + 4y - 3 = 0", "y = -\\frac12 x + \\frac34"),
    ("y = 3x - 2", "3x - y - 2 = 0"),
    ("x \\le 1", "-x \\ge -1"),
    ("k = 3", "3"),
    ("a_3 = 2, a_{37} = 19", "a_{37} = 19, a_3 = 2"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"),
    ("\\begin{pmatrix} -1/2 \\\\ 3/4 \\end{pmatrix}", "\\begin{pmatrix} -0.5 \\\\ 0.75 \\end{pmatrix}"),
    ("x^2 + 2x + 1", "(x+1)^2"),
    ("5r^2-3r-12", "-12-3r+5r^2"),
    ("\\frac{7+5a}{12}", "\\frac{5a+7}{12}"),
    ("\\tan^2 y + 1", "\\sec^2 y"),
    ("2 \\sin b \\cos a", "2\\cos a \\sin b"),
    ("\\frac{1}{2004!}", "\\frac{1}{2006!}"),
    ("1 \\pm \\sqrt{19}", "1 \\pm \\sqrt{19}"),
    ("4 - 3i", "-3i+4"),
    ("\\text{(C)}", "C"),
    ("\\text{north}", "north"),
    ("31_7", "31_{7}"),
    ("45^\\circ", "45"),
    (".0025", "0.0025"),
    ("e^{i\\pi}", "-1"),
    ("\\log_2 8", "3"),
]


class SymbolicChecker:
    """The caller's side: one warm worker process, requests serialised by a lock (one checker per process)."""

    def __init__(
        self,
        cpu_limit_s: float = SYMBOLIC_CPU_LIMIT_S,
        wall_limit_s: float = SYMBOLIC_WALL_LIMIT_S,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.cpu_limit_s = cpu_limit_s
        self.wall_limit_s = wall_limit_s
        self.startup_timeout_s = startup_timeout_s
        self._lock = threading.Lock()
        self._worker: subprocess.Popen | None = None
        self._ready = False

    def start(self) -> None:
        """Start the worker now (it warms up in the background); the first comparison waits for it to be
        ready."""
        with self._lock:
            self._spawn()

    def compare(self, gold: str, pred: str) -> str:
        """One of `COMPARISONS`: `equal` when math-verify proves `pred` equal to `gold`, `different` when not,
        `too_complex` when either answer is past the work bound, `timeout` when the comparison ran out of its
        CPU or wall-clock budget (or the worker failed twice)."""
        with self._lock:
            for _ in range(2):  # a second attempt only after the worker itself failed: on a fresh, warm one
                reply = self._ask(gold, pred)
                if reply is not None:
                    return reply if reply in COMPARISONS else "timeout"
            return "timeout"

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _spawn(self) -> None:
        if self._worker is None:
            self._worker = subprocess.Popen(
                [sys.executable, "-m", "dapo_suite.core.symbolic"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                encoding="ascii",
            )
            self._ready = False

    def _ask(self, gold: str, pred: str) -> str | None:
        """The worker's reply (one of `COMPARISONS`), or None when the worker failed (it is then killed)."""
        self._spawn()
        try:
            if not self._ready:
                if self._read_line(self.startup_timeout_s) != "ready":
                    raise OSError("the symbolic worker did not start")
                self._ready = True
            self._worker.stdin.write(json.dumps([gold, pred, self.cpu_limit_s, self.wall_limit_s]) + "\n")
            self._worker.stdin.flush()
            reply = self._read_line(self.wall_limit_s + REPLY_MARGIN_S)
        except (OSError, ValueError):
            reply = None
        if reply is None:
            self._kill()
        return reply

    def _read_line(self, timeout_s: float) -> str | None:
        readable, _, _ = select.select([self._worker.stdout], [], [], timeout_s)
        return (self._worker.stdout.readline().strip() or None) if readable else None

    def _kill(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker.wait()
            for stream in (self._worker.stdin, self._worker.stdout):
                stream.close()
            self._worker = None


# ---- the worker process ------------------------------------------------------------------------------------


def _as_math(answer: str) -> str:
    """Wrap a bare answer so the LaTeX extractor sees it as one math span."""
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


def _two_stage_parsing() -> None:
    """Parse LaTeX with ANTLR's two-stage strategy: SLL prediction first, full LL only when SLL fails.

    latex2sympy's parser runs in LL mode, whose full-context predictions are not cached: a tuple such as
    `(-2,1)` is predicted from scratch on every parse. On the distinct non-integer answers of MATH train and
    MATH-500, SLL gives the same expression wherever it succeeds (where it fails, the LL path runs), for far
    less time (docs/eval.md). A latex2sympy without these internals keeps its own (slower, same) parsing.
    """
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy

    create_parser, parse = _Latex2Sympy.create_parser, _Latex2Sympy.parse
    mode = [PredictionMode.LL]

    def create_parser_in_mode(self, latex_str):
        parser = create_parser(self, latex_str)
        parser._interp.predictionMode = mode[0]
        return parser

    def parse_two_stage(self, latex_str):
        mode[0] = PredictionMode.SLL
        try:
            return parse(self, latex_str)
        except Exception:  # noqa: BLE001 - a syntax error in SLL mode: the full LL parse decides
            mode[0] = PredictionMode.LL
            return parse(self, latex_str)

    _Latex2Sympy.create_parser, _Latex2Sympy.parse = create_parser_in_mode, parse_two_stage


def _make_comparator():
    """`equivalent(gold, pred) -> bool` on math-verify, with this project's corrections (each says why)."""
    from math_verify import LatexExtractionConfig, parse, verify
    from math_verify.grader import is_assignment_relation, is_equation
    from sympy import Basic, Eq, Interval, Rational, Tuple, cancel

    latex_only = [LatexExtractionConfig(boxed_match_priority=0)]

    def distinct_rationals(gold: object, pred: object) -> bool:
        """math-verify compares numerically, so 1/2004! equals 1/2006!: two exact rationals that differ do
        not."""
        if (
            not (isinstance(gold, Basic) and isinstance(pred, Basic))
            or gold.free_symbols
            or pred.free_symbols
        ):
            return False
        gold, pred = gold.doit(), pred.doit()
        return isinstance(gold, Rational) and isinstance(pred, Rational) and gold != pred

    def proportional_equations(gold: object, pred: object) -> bool:
        """Two equations whose sides' differences have a non-zero constant ratio: the same equation rescaled
        (math-verify reaches this through sympy's `solve`, which can take seconds on a conic)."""
        if not (isinstance(gold, Eq) and isinstance(pred, Eq)) or pred.lhs == pred.rhs:
            return False
        try:
            ratio = cancel((gold.lhs - gold.rhs) / (pred.lhs - pred.rhs))
        except (TypeError, ValueError):  # sides that are sets (x = [-2, 7]) do not subtract
            return False
        return ratio.is_number and ratio.is_zero is False and ratio.is_finite is True

    def equivalent(gold: str, pred: str) -> bool:
        gold_parsed = parse(_as_math(gold), extraction_config=latex_only, parsing_timeout=None)
        pred_parsed = parse(_as_math(pred), extraction_config=latex_only, parsing_timeout=None)
        if not gold_parsed or not pred_parsed:
            return False
        gold_expr, pred_expr = gold_parsed[0], pred_parsed[0]
        # math-verify reads an equation answer against a plain gold by its right side, so `2x = 5` would match
        # the gold 5; only an assignment (`x = 5`, `f(2) = 5`) names its value that way.
        if (
            isinstance(pred_expr, Basic)
            and is_equation(pred_expr)
            and not is_assignment_relation(pred_expr)
            and not (isinstance(gold_expr, Basic) and is_equation(gold_expr))
        ):
            return False
        # math-verify matches a braced set against an ordered pair or an open interval written in the same
        # order ({1,3} = (1,3)); a set is neither.
        if "\\{" in pred and "\\{" not in gold and isinstance(gold_expr, (Tuple, Interval)):
            return False
        if proportional_equations(gold_expr, pred_expr):
            return True
        # allow_set_relation_comp: a relation answer (-2 <= x <= 7) equals the set gold it describes ([-2,
        # 7]).
        if not verify(gold_parsed, pred_parsed, timeout_seconds=None, allow_set_relation_comp=True):
            return False
        return not distinct_rationals(gold_expr, pred_expr)

    return equivalent


def exact_digits(expr: object, budget: list[int]) -> float:
    """An upper bound on the decimal digits of the exact number an unevaluated sympy tree denotes (the larger
    of its numerator and denominator), inf past `MAX_EXACT_DIGITS` or `MAX_SYMBOLIC_DEGREE`; a symbol or a
    constant counts as one digit. `budget` holds the nodes left to visit (`MAX_EXPRESSION_NODES`): inf when it
    runs out.

    Each rule bounds what evaluation would build: |a * b| <= |a| |b| (digits add), a^e has at most
    digits(a) x |e| digits, n! and binomial(n, k) at most n log10(n + 1), a sum or product of N terms N times
    its term's.
    """
    import math

    from sympy import Add, Pow
    from sympy.matrices import MatrixBase

    budget[0] -= 1
    if budget[0] < 0:
        return math.inf
    if getattr(expr, "is_Number", False) and not getattr(expr, "is_infinite", False) and expr.is_finite:
        if expr.is_Rational:
            return math.log10(max(abs(int(expr.p)), int(expr.q)) + 1)
        return math.log10(abs(float(expr)) + 1)  # a float: inf when it overflows
    if isinstance(expr, MatrixBase):
        return sum(exact_digits(entry, budget) for entry in expr)
    if isinstance(expr, Pow):
        base, exponent = exact_digits(expr.base, budget), exact_digits(expr.exp, budget)
        if exponent > 7:  # |e| >= 10^7
            return math.inf
        power = max(round(10**exponent - 1, 6), 1.0)  # |e|, or the larger of |p| and q for e = p/q
        if getattr(expr.base, "free_symbols", None) and power > MAX_SYMBOLIC_DEGREE:
            return math.inf
        return _within(base * power)
    grows = _GROWTH.get(type(expr).__name__)
    args = getattr(expr, "args", ())
    if grows is not None and args:
        return _within(grows(exact_digits(args[0], budget), expr, budget))
    digits = sum(exact_digits(arg, budget) for arg in args)
    if isinstance(expr, Add):
        digits += math.log10(len(args))
    return _within(digits if args else 1.0)


def _within(digits: float) -> float:
    import math

    return digits if digits <= MAX_EXACT_DIGITS else math.inf


def _factorial_digits(argument_digits: float, expr: object, budget: list[int]) -> float:
    """n! (and binomial(n, k), gamma(n)) for an n of `argument_digits` digits: at most n log10(n + 1)."""
    import math

    if argument_digits > 6:
        return math.inf
    n = 10**argument_digits
    return n * math.log10(n + 1) + sum(exact_digits(arg, budget) for arg in expr.args[1:])


def _series_digits(term_digits: float, expr: object, budget: list[int]) -> float:
    """A \\sum or \\prod over limits (i, a, b): at most b - a + 1 terms, each of `term_digits` digits."""
    import math

    terms = 1.0
    for limit in expr.limits:
        low, high = (exact_digits(bound, budget) for bound in limit[1:])
        if max(low, high) > 5:
            return math.inf
        terms *= 10**low + 10**high
    return math.inf if terms > MAX_TERMS else terms * max(term_digits, 1.0)


# Functions whose value outgrows their arguments' digits, by class name (sympy's classes, imported lazily).
_GROWTH = {
    "factorial": _factorial_digits,
    "factorial2": _factorial_digits,
    "binomial": _factorial_digits,
    "gamma": _factorial_digits,
    "Sum": _series_digits,
    "Product": _series_digits,
}


def exceeds_work_bound(answer: str) -> bool:
    """Whether comparing `answer` could take more work than the bound allows: it nests brackets more than
    `MAX_NESTING` deep, or it parses, unevaluated, to a tree of
    more than `MAX_EXPRESSION_NODES` nodes, or one whose exact value would have more than `MAX_EXACT_DIGITS`
    digits, or a power of a symbol past `MAX_SYMBOLIC_DEGREE`. A deterministic verdict: the same on any
    machine, at any load. An answer that does not parse is not bounded here (math-verify then finds it
    different)."""
    import math

    from latex2sympy2_extended import latex2sympy
    from sympy import evaluate

    depth = deepest = 0
    for char in answer:
        depth += (char in "([{") - (char in ")]}")
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        return True
    try:
        with evaluate(False):
            expr = latex2sympy(answer)
        return math.isinf(exact_digits(expr, [MAX_EXPRESSION_NODES]))
    except RecursionError:  # nesting deeper than Python's stack: past any bound
        return True
    except Exception:  # noqa: BLE001 - a parse failure: math-verify decides (and fails to parse it too)
        return False


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a running child has used, from /proc; 0 where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def _compare_in_fork(equivalent, gold: str, pred: str, cpu_limit_s: float, wall_limit_s: float) -> str:
    """One of `COMPARISONS` from a forked child: `too_complex` past the work bound, else the comparison's
    verdict, or `timeout` when it uses up its CPU or wall-clock budget (it is then killed) or dies without
    answering (memory limit)."""
    import resource
    import time

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: bound, compare, write one byte, leave without running any parent clean-up
        os.close(read_end)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
            resource.setrlimit(resource.RLIMIT_CPU, (ORPHAN_CPU_LIMIT_S, ORPHAN_CPU_LIMIT_S))
            if exceeds_work_bound(gold) or exceeds_work_bound(pred):
                verdict = b"c"
            else:
                verdict = b"1" if equivalent(gold, pred) else b"0"
        except Exception:  # noqa: BLE001 - any parser or sympy failure means "not proven equal"
            verdict = b"0"
        os.write(write_end, verdict)
        os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + wall_limit_s
    answer = b""
    try:
        while not answer:
            readable, _, _ = select.select(
                [read_end], [], [], min(CPU_POLL_S, max(0.0, deadline - time.monotonic()))
            )
            if readable:
                answer = os.read(read_end, 1) or b"-"  # end of file: the child died without answering
            elif time.monotonic() >= deadline or _cpu_seconds(pid) >= cpu_limit_s:
                break
    finally:
        os.close(read_end)
        if not answer:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    return {b"1": "equal", b"0": "different", b"c": "too_complex"}.get(answer, "timeout")


def main() -> None:
    import gc
    import logging

    logging.disable(logging.CRITICAL)  # math-verify warns that its own (signal) timeout is off
    _two_stage_parsing()
    equivalent = _make_comparator()
    for gold, pred in WARM_UP:
        equivalent(gold, pred)
    # forked children then share these pages instead of copying them as the collector touches them
    gc.freeze()
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            gold, pred, cpu_limit_s, wall_limit_s = json.loads(line)
            reply = _compare_in_fork(
                equivalent, str(gold), str(pred), float(cpu_limit_s), float(wall_limit_s)
            )
        except (ValueError, TypeError):
            reply = "different"
        print(reply, flush=True)


if __name__ == "__main__":
    main()
