"""The program a sandboxed call runs (its source is passed to `python -I -S -c`; standard library only).

argv[1] is a JSON object: `site` (a folder to import numpy and sympy from), `preload` (import them now, before
the code arrives: a warm worker), and the limits in bytes and seconds. The worker writes one byte to stdout
when it is ready, reads `{"code", "stdin"}` as JSON from stdin up to its end, lowers its rlimits to the
call's, and runs the code as a notebook cell does: a last line that is an expression prints its value.
"""

import ast
import io
import json
import linecache
import math
import os
import resource
import sys
import traceback

FILENAME = "<code>"


def set_limits(limits):
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(usage.ru_utime + usage.ru_stime + limits["cpu_seconds"])
    resource.setrlimit(
        resource.RLIMIT_CPU, (cpu, cpu + 1)
    )  # SIGXCPU at the soft limit, SIGKILL a second later
    for name, value in (
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["file_size_bytes"]),
        ("RLIMIT_NOFILE", 64),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def report(error):
    """The traceback of `error` from the code's own frames on (none of this worker's)."""
    if isinstance(error, MemoryError):
        os.write(2, b"MemoryError: the sandbox's memory limit was reached\n")
        return
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    sys.stderr.write("".join(traceback.format_exception(type(error), error, tb)))


def run(code):
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        tree = ast.parse(code, FILENAME)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, FILENAME, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), FILENAME, "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as error:
        if error.code is None or isinstance(error.code, int):
            return error.code or 0
        print(error.code, file=sys.stderr)
        return 1
    except BaseException as error:  # noqa: BLE001 - the model sees every failure as text
        sys.stdout.flush()
        report(error)
        return 1
    return 0


def main():
    config = json.loads(sys.argv[1])
    sys.path.append(config["site"])  # -I -S leave the standard library only: numpy and sympy come from here
    if config["preload"]:
        for module in ("numpy", "sympy"):
            try:
                __import__(module)
            except ImportError:
                pass
    os.write(1, b"R")  # ready: the host starts the call's clock when it reads this
    payload = json.loads(sys.stdin.buffer.read().decode("utf-8", errors="replace"))
    sys.stdin.close()
    sys.stdin = io.StringIO(payload.get("stdin") or "")  # what the code reads as its input
    set_limits(config)
    status = run(payload["code"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter teardown: unloading sympy takes longer than most calls run


main()
