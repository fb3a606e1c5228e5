"""The sandbox for model-written Python (dapo_suite/core/sandbox): what a call sees and may do, escape
attempts of our own, each contained and reported, and the host (the trainer) unharmed. Real bubblewrap:
skipped with its install hint where this machine cannot isolate a call."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dapo_suite.core.sandbox import RunResult, Sandbox, SandboxLimits, SandboxUnavailable
from dapo_suite.core.sandbox import isolation as isolation_module
from dapo_suite.core.sandbox.limits import truncate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sandbox():
    problem = isolation_module.bwrap_problem()
    if problem:
        pytest.skip(f"no isolation on this machine: {problem}")
    with Sandbox(
        SandboxLimits(
            wall_seconds=3, cpu_seconds=2, memory_mb=512, file_size_mb=1, tmp_mb=4, output_bytes=4096
        )
    ) as box:
        yield box


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_a_call_prints_and_shows_its_last_expression(sandbox):
    result = sandbox.run("x = 237 + 574\nprint(x)\nx * 2")
    assert (result.outcome, result.return_code, result.stdout) == ("ok", 0, "811\n1622\n")
    assert result.model_view() == "811\n1622"


def test_numpy_and_sympy_are_there(sandbox):
    result = sandbox.run("import numpy as np, sympy\nprint(int(np.arange(5).sum()), sympy.factorint(360))")
    assert result.stdout == "10 {2: 3, 3: 2, 5: 1}\n", result


def test_an_exception_shows_the_code_s_own_traceback(sandbox):
    result = sandbox.run("def f(n):\n    return 1 / n\nf(0)")
    assert result.outcome == "error" and result.return_code == 1
    assert 'File "<code>", line 2, in f' in result.stderr and "ZeroDivisionError" in result.stderr
    assert "worker" not in result.stderr  # none of the sandbox's own frames
    assert sandbox.run("def f(:").stderr.strip().endswith("SyntaxError: invalid syntax")


def test_no_network(sandbox):
    result = sandbox.run("import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 53))")
    assert result.outcome == "error" and "Network is unreachable" in result.stderr
    interfaces = sandbox.run("import socket; print(sorted(n for _, n in socket.if_nameindex()))")
    assert interfaces.stdout.strip() == "['lo']"


def test_no_view_of_host_files(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("key")
    for path in (secret, REPO / "pyproject.toml", Path("/etc/passwd"), Path.home() / ".bashrc"):
        result = sandbox.run(f"print(open({str(path)!r}).read())")
        assert result.outcome == "error" and "No such file or directory" in result.stderr, (path, result)
    listing = sandbox.run("import os; print(sorted(os.listdir('/')))").stdout
    assert "home" not in listing and "work" not in listing and "etc" in listing  # /etc holds ld.so.cache only
    assert sandbox.run("import os; print(os.listdir('/etc'))").stdout.strip() in ("['ld.so.cache']", "[]")


def test_no_view_of_host_environment_or_processes(sandbox, monkeypatch):
    monkeypatch.setenv("DAPO_SUITE_TEST_SECRET", "sk-do-not-leak")
    result = sandbox.run(
        "import os; print(dict(os.environ)); print(sorted(p for p in os.listdir('/proc') if p.isdigit()))"
    )
    assert "sk-do-not-leak" not in result.stdout and "DAPO_SUITE_TEST_SECRET" not in result.stdout
    pids = eval(result.stdout.strip().splitlines()[-1])
    assert len(pids) <= 3, pids  # bubblewrap's init and the call itself: no host process


def test_writes_only_to_a_private_tmp(sandbox):
    # a call's working folder is its private tmpfs
    assert sandbox.run("import os; print(os.getcwd())").stdout == isolation_module.WORK_DIR + "\n"
    assert sandbox.run("open('a.txt', 'w').write('x'); print(open('a.txt').read())").stdout == "x\n"
    assert "No such file" in sandbox.run("open('a.txt')").stderr  # the next call gets a fresh one
    for path in ("/usr/lib/x", "/x", "/sandbox/site/numpy/x"):
        result = sandbox.run(f"open({path!r}, 'w')")
        assert result.outcome == "error" and (
            "Read-only file system" in result.stderr or "Permission denied" in result.stderr
        ), (path, result)


def test_file_size_and_tmp_size_are_bounded(sandbox):
    big = sandbox.run("open('big', 'wb').write(b'x' * (2 << 20))")  # over file_size_mb = 1
    assert big.outcome == "error" and "File too large" in big.stderr, big
    many = sandbox.run("for i in range(8):\n    open(f'f{i}', 'wb').write(b'x' * 900_000)")  # over tmp_mb 4
    assert many.outcome == "error" and "No space left on device" in many.stderr, many


def test_a_fork_bomb_is_contained(sandbox):
    start = time.monotonic()
    result = sandbox.run("import os\nwhile True:\n    os.fork()")
    assert result.outcome == "error" and "Operation not permitted" in result.stderr
    spawn = sandbox.run("import subprocess; subprocess.run(['/usr/bin/true'])")
    assert spawn.outcome == "error"
    assert time.monotonic() - start < 10


def test_memory_is_bounded(sandbox):
    result = sandbox.run("x = bytearray(2 * 1024 ** 3)")
    assert result.outcome == "memory_limit" and "memory limit (512 MB)" in result.message


def test_an_endless_loop_is_stopped_by_cpu_and_by_wall_time(sandbox):
    with Sandbox(
        SandboxLimits(wall_seconds=60, cpu_seconds=1), pool_size=0
    ) as cpu_bound:  # CPU first, even busy
        cpu = cpu_bound.run("while True:\n    pass")
    assert cpu.outcome == "cpu_limit" and "CPU time limit (1 s)" in cpu.message and cpu.execution_time < 30, (
        cpu
    )
    wall = sandbox.run("import time\ntime.sleep(60)")
    assert (
        wall.outcome == "timeout"
        and 3 <= wall.execution_time < 5
        and "wall-time limit of 3 s" in wall.message
    )


def test_huge_output_is_cut_and_the_call_stopped(sandbox):
    result = sandbox.run("while True:\n    print('x' * 1000)")
    assert result.outcome == "output_limit" and len(result.stdout) == 4096 and result.execution_time < 3


def test_signals_to_the_parent_or_anyone_reach_no_host_process(sandbox):
    host = os.getpid()
    result = sandbox.run(
        f"import os, signal\nfor pid in (os.getppid(), 1, {host}, -1):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print(pid, e)"
    )
    assert os.getpid() == host and sandbox.run("print('alive')").stdout == "alive\n"
    assert "No such process" in result.stdout  # the host's pid does not exist in the sandbox's namespace


def test_no_process_is_left_behind(sandbox):
    import threading

    before = descendants(os.getpid())
    sandbox.run(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\nprint('done')"
    )
    sandbox.run("import time\ntime.sleep(60)")  # killed at the wall-time limit
    time.sleep(0.5)
    spares = {w.process.pid for w in sandbox._spares}
    left = descendants(os.getpid()) - before - spares - {d for s in spares for d in descendants(s)}
    assert not left, f"processes left behind: {left}"
    assert threading.active_count() >= 1  # the host's own threads untouched


def test_calls_run_side_by_side_from_threads(sandbox):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(sandbox.run, [f"print({i} * {i})" for i in range(8)]))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]


def test_without_bubblewrap_the_sandbox_refuses_and_says_what_to_install(monkeypatch):
    isolation_module.bwrap_problem.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap.*--unsafe-no-isolation"):
            Sandbox()
    finally:
        monkeypatch.undo()
        isolation_module.bwrap_problem.cache_clear()


def test_the_opt_out_runs_unsandboxed_and_says_so(caplog):
    with Sandbox(pool_size=0, isolation="unsafe-none") as box:
        result = box.run("import os; print(os.path.isdir('/proc/1'))")
    assert result.outcome == "ok" and "isolation is off" in caplog.text


def test_limits_are_validated_and_model_views_cut():
    with pytest.raises(ValueError, match="memory_mb must be >= 256"):
        SandboxLimits(memory_mb=64)
    result = RunResult("ok", 0, "a" * 50 + "b" * 50, "", 0.1)
    assert truncate("x" * 10, 20) == "x" * 10
    assert result.model_view(20, "right").startswith("a" * 20) and result.model_view(20, "left").endswith(
        "b" * 20
    )
    middle = result.model_view(20, "middle")
    assert middle.startswith("a" * 10) and middle.endswith("b" * 10) and "80 characters cut" in middle
    with pytest.raises(ValueError, match="truncate side"):
        truncate("x", 0, "top")
