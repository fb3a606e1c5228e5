"""`python -m dapo_suite.train.verl.async_entry MODE <hydra overrides>`: verl's async trainer MODE
("one_step", "fully"; keys.ASYNC_TRAINERS) with DAPO's group filter (async_trainers.py). verl's own entry
point parses the overrides against its packaged config and runs; only its task runner is replaced."""

from __future__ import annotations

import sys


def main() -> None:
    from dapo_suite.train.verl.async_trainers import TASK_RUNNERS, as_actor_like
    from dapo_suite.train.verl.validate import async_config_dir

    mode = sys.argv.pop(1)
    module, name, runner = TASK_RUNNERS[mode]
    # verl's main names its config folder relative to itself, which Hydra resolves only when run as a script
    sys.argv[1:1] = ["--config-path", str(async_config_dir(mode))]
    # verl's main starts the runner it finds under this name
    setattr(module, name, as_actor_like(getattr(module, name), runner))
    module.main()


if __name__ == "__main__":
    main()
