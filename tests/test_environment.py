"""The dependency set holds together: verl's Hydra and the answer checkers share one antlr runtime."""

import subprocess
import sys

from click.testing import CliRunner


def test_verl_hydra_and_latex_parser_import_together():
    # One fresh interpreter, as a user's script would be: a latex2sympy2 that pins antlr 4.7.2 breaks hydra
    # here.
    code = (
        "import verl, hydra, omegaconf, latex2sympy2_extended, math_verify\nfrom importlib.metadata import "
        "version\nfrom latex2sympy2_extended import latex2sympy\nfrom hydra import compose, "
        "initialize_config_module\nassert str(latex2sympy(r'\\frac{1}{2}')) == '1/2'\nwith "
        "initialize_config_module(config_module='verl.trainer.config', version_base=None):\n    cfg = "
        "compose(config_name='ppo_trainer')\nassert cfg.algorithm.adv_estimator == "
        "'gae'\nprint(version('verl'), version('antlr4-python3-runtime'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    verl_version, antlr_version = result.stdout.split()
    assert verl_version.startswith("0.9.")
    assert antlr_version == "4.9.3"


def test_latex2sympy2_is_not_installed():
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("latex2sympy2")
    except PackageNotFoundError:
        return
    raise AssertionError("latex2sympy2 is installed: it pins antlr 4.7.2 and breaks verl's hydra")


def test_help_lists_every_stage():
    from dapo_suite.cli import main

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for stage in ("data", "train", "eval", "serve"):
        assert f"\n  {stage} " in result.output


def test_console_script_is_installed():
    result = subprocess.run(
        ["dapo-suite", "--version"],
        capture_output=True,
        text=True,
        env={"PATH": str(__import__("pathlib").Path(sys.executable).parent)},
    )
    assert result.returncode == 0 and "dapo-suite" in result.stdout


def test_a_stage_not_built_yet_says_so_and_exits_non_zero(monkeypatch):
    from dapo_suite import cli

    monkeypatch.setitem(
        cli.STAGES, "later", ("dapo_suite.stage_that_does_not_exist", "later", "A future stage.")
    )
    result = CliRunner().invoke(cli.main, ["later", "--anything"])
    assert result.exit_code != 0
    assert "not built yet" in result.output
    assert "A future stage." in CliRunner().invoke(cli.main, ["--help"]).output
