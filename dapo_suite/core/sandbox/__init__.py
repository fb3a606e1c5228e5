"""A sandbox for model-written Python: every call runs in a fresh process, isolated by bubblewrap's
namespaces, held by rlimits and (on x86-64 and aarch64) a seccomp filter, and killed whole at a limit.

    from dapo_suite.core.sandbox import Sandbox
    with Sandbox() as sandbox:
        result = sandbox.run("print(237 + 574)")   # RunResult(outcome="ok", stdout="811\n", ...)
        result.model_view()                        # what the model is shown

Where isolation is unavailable `Sandbox()` raises `SandboxUnavailable`, whose message says what to install;
`Sandbox(isolation="unsafe-none")` is the only way round (docs/tools.md).
"""

from dapo_suite.core.sandbox.isolation import ISOLATIONS, SandboxUnavailable
from dapo_suite.core.sandbox.limits import OUTCOMES, RunResult, SandboxLimits
from dapo_suite.core.sandbox.runner import Sandbox

__all__ = ["ISOLATIONS", "OUTCOMES", "RunResult", "Sandbox", "SandboxLimits", "SandboxUnavailable"]
