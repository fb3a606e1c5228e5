"""How a sandboxed call is started: the bubblewrap command line (namespaces, read-only binds of the
interpreter, its standard library, numpy and sympy, a private /tmp, no network, no host environment) and the
check that this machine can run it.

`ISOLATIONS` names the ways: `bwrap` (the default) and `unsafe-none`, which runs the code as this user with
rlimits only: the host's files, network and environment are then open to it. Nothing falls back to it
silently.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from dapo_suite.core.errors import UserError

ISOLATIONS = ("bwrap", "unsafe-none")
SITE = "/sandbox/site"  # where numpy and sympy appear inside the sandbox
# inside the sandbox: its private tmpfs, the only writable place, and the call's working folder
WORK_DIR = "/tmp"
PACKAGES = ("numpy", "numpy.libs", "sympy", "mpmath")  # numpy.libs: a numpy wheel's own OpenBLAS
SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32")
SANDBOX_ENV = {
    "PATH": "/usr/bin",
    "HOME": WORK_DIR,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
    "bubblewrap`; Arch: `sudo pacman -S bubblewrap`), or, knowing that model-written code then reads "
    "your files and network, opt out with --unsafe-no-isolation (isolation: unsafe-none)"
)


class SandboxUnavailable(UserError):
    """This machine cannot isolate a call; the message says what to install or enable."""


def require_isolation(isolation: str) -> None:
    if isolation not in ISOLATIONS:
        raise UserError(f"sandbox isolation {isolation!r} is not one of {', '.join(ISOLATIONS)}")
    if isolation == "bwrap":
        problem = bwrap_problem()
        if problem:
            raise SandboxUnavailable(f"cannot sandbox model-written code: {problem}")


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate a call here (None: it can), from one trial run of the real command."""
    if sys.platform != "linux":
        return f"bubblewrap runs on Linux only (this is {sys.platform}); {INSTALL_HINT.split(', or, ')[1]}"
    if shutil.which("bwrap") is None:
        return f"bwrap is not on PATH: {INSTALL_HINT}"
    argv = bwrap_argv(interpreter_binds(), tmp_bytes=1 << 20) + [
        str(Path(sys.executable).resolve()),
        "-I",
        "-S",
        "-c",
        "pass",
    ]
    try:
        trial = subprocess.run(
            argv, capture_output=True, timeout=30, env={"PATH": os.environ.get("PATH", "")}
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap did not run ({error}): {INSTALL_HINT}"
    if trial.returncode != 0:
        reason = trial.stderr.decode(errors="replace").strip() or f"exit status {trial.returncode}"
        return (
            f"bwrap could not create the sandbox's namespaces ({reason}); unprivileged user namespaces may "
            f"be disabled (sysctl kernel.unprivileged_userns_clone=1, or Ubuntu's "
            f"kernel.apparmor_restrict_unprivileged_userns=0), or the interpreter's files are not readable "
            f"by this user"
        )
    return None


@functools.cache
def interpreter_binds() -> tuple[tuple[str, str], ...]:
    """(host path, sandbox path) pairs bound read-only: this interpreter, its shared library and standard
    library at their own paths (the binary finds them there), and numpy, sympy and mpmath under SITE."""
    executable = Path(sys.executable).resolve()
    binds = [(str(executable), str(executable))]
    library = Path(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME") or "")
    if library.is_file() and not str(library).startswith(SYSTEM_LIBRARIES):
        binds.append((str(library), str(library)))
    stdlib = sysconfig.get_paths()["stdlib"]
    if not stdlib.startswith(SYSTEM_LIBRARIES):
        binds.append((stdlib, stdlib))
    for name in PACKAGES:
        folder = package_folder(name)
        if folder:
            binds.append((folder, f"{SITE}/{name}"))
    return tuple(binds)


def package_folder(name: str) -> str | None:
    if name.endswith(".libs"):  # not a module: the folder beside its package
        folder = package_folder(name.removesuffix(".libs"))
        sibling = folder and Path(folder).parent / name
        return str(sibling) if sibling and sibling.is_dir() else None
    spec = importlib.util.find_spec(name)
    return spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None


def hidden_folders(binds: tuple[tuple[str, str], ...]) -> list[str]:
    """Installed-package folders that a bound folder contains (the base interpreter's own site-packages, a
    distribution's dist-packages): an empty tmpfs covers each."""
    roots = [inside for _, inside in binds] + [p for p in SYSTEM_LIBRARIES if os.path.isdir(p)]
    base = {"base": sys.base_prefix, "platbase": sys.base_prefix}
    candidates = [
        *site.getsitepackages(),
        sysconfig.get_paths(vars=base)["purelib"],
        "/usr/lib/python3/dist-packages",
    ]
    return sorted({c for c in candidates if os.path.isdir(c) and any(c.startswith(r + "/") for r in roots)})


def bwrap_argv(
    binds: tuple[tuple[str, str], ...], tmp_bytes: int, seccomp_fd: int | None = None
) -> list[str]:
    """The bubblewrap command up to the program: every namespace unshared (network, PIDs, IPC, UTS, cgroup,
    user: uid 65534 inside), dying with its parent, a new session (no terminal to push input into), no
    capabilities, no further user namespaces, an environment of SANDBOX_ENV only, the system's shared
    libraries and `binds` read-only, its own /proc and /dev, and a private /tmp of `tmp_bytes` as the working
    folder."""
    argv = [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    for name, value in SANDBOX_ENV.items():
        argv += ["--setenv", name, value]
    for path in SYSTEM_LIBRARIES:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    if os.path.isfile("/etc/ld.so.cache"):  # the loader's index of those libraries
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for outside, inside in binds:
        argv += ["--ro-bind", outside, inside]
    for folder in hidden_folders(binds):
        argv += ["--tmpfs", folder]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmp_bytes),
        "--tmpfs",
        WORK_DIR,
        "--remount-ro",
        "/",
        "--chdir",
        WORK_DIR,
    ]  # the root read-only: WORK_DIR is the only writable place
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv
