"""The policy loss's hyperparameters: one frozen record, each knob with its one default, range and
description.

`TrainConfig` takes its loss fields' defaults from here and builds the record once (`TrainConfig.loss`); the
trainer hands it whole to `algorithm.policy_loss`, as verl hands each loss its `ActorConfig`. Names are verl
0.9.1's (`actor.policy_loss.*` / `actor.*`), but `clip_ratio_low/high/c` -> `clip_low/high/c` and
`loss_agg_mode` -> `loss_agg`. No torch here: the config imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def knob(default: Any, interval: str | None, description: str) -> Any:
    """A field with its allowed interval (None: not numeric, its registry checks it) and a one-line
    description that `dapo-suite train --help` and the config validation read."""
    return field(default=default, metadata={"interval": interval, "description": description})


@dataclass(frozen=True)
class LossHyperparameters:
    """Every policy-loss knob; each mode reads the ones its equation has (algorithm.POLICY_LOSSES)."""

    loss_mode: str = knob(
        "vanilla",
        None,
        "objective, by verl's names: vanilla (DAPO), gspo, cispo, sapo, geo_mean (GMPO), clip_cov, kl_cov",
    )
    clip_low: float = knob(0.2, "[0, 1]", "eps_low of the clipped ratio (eq. 10); 1 = no lower bound (CISPO)")
    clip_high: float = knob(0.28, "[0, inf)", "eps_high: Clip-Higher when above clip_low (eq. 10)")
    clip_c: float | None = knob(
        10.0, "(1, inf)", "dual-clip bound for negative advantages (32B recipe: 10); null = off"
    )
    loss_agg: str = knob(
        "token-mean",
        None,
        "reduction: token-mean (DAPO's token-level loss, eq. 8), token-sum, "
        "seq-mean-token-mean (GRPO), seq-mean-token-sum, seq-mean-token-sum-norm",
    )
    clip_cov_ratio: float = knob(0.0002, "(0, 1]", "Clip-Cov: share r of tokens whose gradient is cut")
    clip_cov_lb: float = knob(
        1.0, "[0, inf)", "Clip-Cov: covariance window's lower end (cuts high positive covariance)"
    )
    clip_cov_ub: float = knob(5.0, "[0, inf)", "Clip-Cov: covariance window's upper end")
    kl_cov_ratio: float = knob(0.0002, "(0, 1]", "KL-Cov: share k of tokens given the KL penalty")
    ppo_kl_coef: float = knob(0.1, "[0, inf)", "KL-Cov: the penalty's weight beta")
    tau_pos: float = knob(1.0, "(0, inf)", "SAPO: gate temperature for A > 0")
    tau_neg: float = knob(1.05, "(0, inf)", "SAPO: gate temperature for A <= 0")


LOSS_DEFAULTS = LossHyperparameters()
LOSS_KNOBS = tuple(f.name for f in fields(LossHyperparameters))
# The numeric knobs' intervals and descriptions, for the config's range check.
LOSS_RANGES: dict[str, tuple[str, str]] = {
    f.name: (f.metadata["interval"], f.metadata["description"])
    for f in fields(LossHyperparameters)
    if f.metadata["interval"]
}


def knob_rows() -> list[tuple[str, Any, str | None, str]]:
    """(name, default, interval or None, description) of every knob, in field order: what --help and the docs
    show."""
    return [
        (f.name, getattr(LOSS_DEFAULTS, f.name), f.metadata["interval"], f.metadata["description"])
        for f in fields(LossHyperparameters)
    ]


def loss_knobs_help() -> str:
    """One line per knob (name, default, range, description) for `--help`."""
    return "\n".join(
        f"  {name} = {default}" + (f" in {interval}" if interval else "") + f": {description}"
        for name, default, interval, description in knob_rows()
    )


def loss_knobs_markdown() -> str:
    """The same knobs as a markdown table: docs/train.md holds it verbatim (a test compares the two)."""
    rows = [
        f"| `{name}` | {default} | {interval or 'a name'} | {description} |"
        for name, default, interval, description in knob_rows()
    ]
    return "\n".join(["| knob | default | range | meaning |", "|---|---|---|---|", *rows])
