"""`dapo-suite train`: DAPO training with presets, on the embedded trainer or (at scale) on verl."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from dapo_suite.core.errors import UserError
from dapo_suite.core.lock import output_lock
from dapo_suite.inference.models import EMBEDDED_MODEL
from dapo_suite.train.config import LADDER, SUCCESSORS
from dapo_suite.train.loss_hyperparameters import loss_knobs_help
from dapo_suite.train.studies_cli import effects, ladder


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\nThe policy loss's knobs (--set NAME=VALUE), with their defaults:\n" + loss_knobs_help(),
)
@click.option(
    "--preset",
    "presets",
    multiple=True,
    metavar="NAME",
    help="Preset(s), applied in order: a scale (tiny-cpu: the embedded default on the arithmetic task; "
    "gsm8k-cpu: the embedded model on GSM8K), a rung of the ablation ladder "
    f"({', '.join(LADDER)}) or a successor method ({', '.join(SUCCESSORS)}). A .yaml path works too.",
)
@click.option(
    "--model",
    help="HF model directory, hub id, or short name of a family docs/train.md lists "
    "(Qwen2.5-32B -> Qwen/Qwen2.5-32B; default: the embedded SmolLM2-135M-Instruct). With "
    "a model other than the embedded one, the paper's 32B-run values are the base.",
)
@click.option(
    "--train-file",
    type=click.Path(dir_okay=False),
    help="Training data: verl/DAPO parquet or jsonl (default: the built-in arithmetic task).",
)
@click.option("--val-file", type=click.Path(dir_okay=False), help="Held-out data in the same formats.")
@click.option("--out", type=click.Path(file_okay=False), help="Run directory (default runs/dapo).")
@click.option("--max-steps", type=int, help="Training steps (each: rollout, filter, mini-batch updates).")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    help="Seed of the run: held-out split, prompts, samples [0]. The "
    "same seed, machine and thread count repeat a run bit for bit.",
)
@click.option("--backend", type=click.Choice(["embedded", "verl"]), help="embedded (this process) or verl.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue from the run directory's last checkpoint, with the run's own settings (OUT/config.yaml; "
    "--preset, --set and flags given now apply on top).",
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any config field, e.g. --set clip_high=0.28 --set group_size=16. With --backend verl, "
    "--set verl.<hydra.key>=VALUE passes a raw Hydra override to verl (applied last).",
)
@click.option(
    "--print-config",
    is_flag=True,
    help="Print the resolved config (and, on stderr, the memory estimate) and exit.",
)
@click.option(
    "--no-memory-check",
    "memory_check",
    flag_value=False,
    default=True,
    help="Train even when the memory estimate exceeds this machine's memory (the embedded trainer "
    "refuses such a run before loading the model, and says what would fit).",
)
@click.option("--nnodes", type=int, default=1, show_default=True, help="[verl] Nodes in the Ray cluster.")
@click.option(
    "--gpus-per-node",
    type=int,
    help="[verl] GPUs per node (default 8; with --device cpu, 1: the number "
    "of FSDP workers, each a process on the CPU; 2 with --set async=...).",
)
@click.option(
    "--tp", type=int, help="[verl] vLLM tensor-parallel size (default: min(4, GPUs per node); recipe 4)."
)
@click.option(
    "--sp", type=int, help="[verl] Ulysses sequence-parallel size (default: min(8, GPUs); recipe 8)."
)
@click.option(
    "--offload/--no-offload",
    default=None,
    help="[verl] FSDP parameter and optimizer offload (default: on from 8 GPUs, as the recipe).",
)
@click.option(
    "--gpu-memory-utilization",
    type=float,
    default=0.8,
    show_default=True,
    help="[verl] vLLM's share of each GPU's memory.",
)
@click.option(
    "--rollout-gpus",
    type=int,
    help="[verl, --set async=...] GPUs that generate; the rest train (default: "
    "half; whole nodes on a multi-node cluster).",
)
@click.option(
    "--ray-address",
    help="[verl] Submit to this Ray cluster with `ray job submit` (e.g. http://head:8265); "
    "default: start a local Ray.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="Where training runs. Embedded trainer: its torch device. verl: cpu runs verl's trainer on this "
    "machine's CPU (FSDP2 over gloo, vLLM-CPU rollout; `make verl-cpu-env` first); auto is cpu when no "
    "GPU is found here and neither --ray-address, --nnodes nor --gpus-per-node says otherwise.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="[verl] Validate against verl's Hydra config, write verl_config.yaml "
    "and verl_command.sh to the run directory, print the command, stop.",
)
@click.pass_context
def train(
    ctx: click.Context,
    presets,
    model,
    train_file,
    val_file,
    out,
    max_steps,
    seed,
    backend,
    resume,
    assignments,
    print_config,
    memory_check,
    nnodes,
    gpus_per_node,
    tp,
    sp,
    offload,
    gpu_memory_utilization,
    rollout_gpus,
    ray_address,
    device,
    dry_run,
) -> None:
    """Train a reasoner with DAPO (clip-higher, dynamic sampling, token-level loss, overlong shaping, no KL).

    \b
    Examples:
      dapo-suite train                                   # embedded model, tiny-cpu scale, dapo switches
      dapo-suite train --preset grpo --out runs/grpo     # the ablation ladder's first rung
      dapo-suite data build --input gsm8k --out runs/data/gsm8k && \
          dapo-suite train --preset gsm8k-cpu --out runs/gsm8k   # DAPO on GSM8K's train split (CPU, hours)
      dapo-suite train --preset dapo --model Qwen/Qwen2.5-32B --print-config   # the paper's 32B settings
      dapo-suite train --preset gsm8k-cpu --model Qwen2.5-0.5B-Instruct --set lora_rank=16 --print-config
                                                         # a short name, and the memory it needs here
      dapo-suite train --resume --out runs/dapo          # continue after a crash
      dapo-suite train plot runs/dapo                    # training-dynamics PNG
      dapo-suite train --backend verl --preset dapo --model Qwen/Qwen2.5-32B --nnodes 16 --gpus-per-node 8 \\
          --train-file dapo-math-17k.parquet --out runs/dapo-32b --dry-run   # the paper's run on verl
      dapo-suite train export runs/dapo-32b              # verl FSDP checkpoint -> Hugging Face directory
      dapo-suite train --set lora_rank=16 --set lora_alpha=32 --out runs/lora   # LoRA adapters on a frozen
      base dapo-suite train export runs/lora                  # the adapters merged -> Hugging Face directory

    Presets: tiny-cpu, gsm8k-cpu (scale); grpo, +overlong-filter, +clip-higher, +soft-overlong, +token-loss,
    dapo (ablation ladder); gspo, cispo, sapo, gmpo, clip-cov, kl-cov (successors).
    Run outputs: config.yaml, metrics.jsonl, tensorboard/, checkpoints/step-000001 ... (Hugging Face format),
    checkpoint-last, summary.json, training_dynamics.png.
    """
    if ctx.invoked_subcommand is not None:
        return
    from dapo_suite.train.config import TrainConfig, parse_override, resolve_config

    if resume and (saved := Path(out or TrainConfig.out) / "config.yaml").is_file():
        presets = (str(saved), *presets)  # the run continues as it was set up, not from the defaults
    passthrough = [a.split(".", 1)[1] for a in assignments if a.startswith("verl.")]
    try:
        overrides = dict(
            model=_hub_name(model),
            train_file=train_file,
            val_file=val_file,
            out=out,
            max_steps=max_steps,
            seed=seed,
            backend=backend,
            device=None if device == "auto" else device,
        )
        settings = dict(parse_override(a) for a in assignments if not a.startswith("verl."))
        config = resolve_config(presets, overrides, settings)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    if print_config:
        from dapo_suite.train.config import describe

        click.echo(describe(config))
        if config.backend == "verl":
            _echo_verl_memory(config, nnodes, gpus_per_node)
        elif (memory := _memory(config)) is not None:
            click.echo(_memory_report(memory, config, ctx), err=True)
        return
    if config.backend == "verl":
        verl_device = _verl_device(device, nnodes, gpus_per_node, ray_address, gpu_layout=(tp, sp, offload))
        # on a CPU one worker, or one per side of an async run
        gpus = gpus_per_node or ((1 if config.async_mode == "off" else 2) if verl_device == "cpu" else 8)
        if dry_run and verl_device != "cpu":
            _echo_verl_memory(config, nnodes, gpus)
        _train_verl(
            config,
            passthrough,
            dry_run,
            resume,
            dict(
                nnodes=nnodes,
                gpus_per_node=gpus,
                rollout_tp=tp,
                ulysses_sp=sp,
                offload=offload,
                ray_address=ray_address,
                gpu_memory_utilization=gpu_memory_utilization,
                rollout_gpus=rollout_gpus,
                device=verl_device,
            ),
        )
        return
    if dry_run or passthrough:
        raise click.UsageError("--dry-run and --set verl.* apply to --backend verl only")
    if (memory := _memory(config)) is not None:
        if not memory.fits and memory_check:
            raise UserError(_memory_report(memory, config, ctx))
        click.echo(_memory_report(memory, config, ctx), err=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from dapo_suite.train.trainer import DAPOTrainer

    run_dir = Path(config.out)
    if not resume and (run_dir / "metrics.jsonl").is_file():
        raise click.UsageError(
            f"{run_dir} already holds a run: add --resume to continue it, or pick another --out"
        )
    with output_lock(run_dir):
        try:
            trainer = DAPOTrainer(config, resume=resume)
        except (
            FileNotFoundError,
            RuntimeError,
        ) as error:  # a missing model, vLLM without a GPU, another model's checkpoint
            raise click.ClickException(str(error)) from error
        summary = trainer.fit()
    from dapo_suite.train.plots import plot_run

    png = plot_run(run_dir)
    if "before" in summary and "after" in summary:
        before, after = summary["before"], summary["after"]
        click.echo(
            f"held-out accuracy (avg@{config.val_n}, {before['problems']} problems): "
            f"{before['acc']:.3f} -> {after['acc']:.3f} ({(after['acc'] - before['acc']) * 100:+.1f} points)"
        )
    if "verdict" in summary:
        click.echo(summary["verdict"]["text"])
    click.echo(
        f"run directory: {run_dir}\ntraining dynamics: {png}\ncheckpoint: {run_dir / 'checkpoint-last'}"
    )


@train.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out", type=click.Path(dir_okay=False), help="PNG path (default RUN_DIR/training_dynamics.png)."
)
def plot(run_dir: str, out: str | None) -> None:
    """Draw the paper's training-dynamics panels (accuracy, entropy, length, clip fractions) to a PNG."""
    from dapo_suite.train.plots import plot_run

    try:
        click.echo(plot_run(Path(run_dir), Path(out) if out else None))
    except FileNotFoundError as error:
        raise click.UsageError(str(error)) from error


def _hub_name(model: str | None) -> str | None:
    """--model as every stage takes it: a short name (Qwen2.5-32B) becomes its hub id, said once here; a
    folder, a path or a hub id stays as given."""
    from dapo_suite.inference.hub import hub_id, looks_like_path

    if model in (None, EMBEDDED_MODEL) or looks_like_path(model) or Path(model).expanduser().exists():
        return model
    resolved = hub_id(model)
    if resolved != model:
        click.echo(f"model: {model} is {resolved} on the Hugging Face hub", err=True)
    return resolved


def _model_shape(model: str) -> dict | None:
    """config.json's fields of a --model value, the embedded model's under its registry name."""
    from dapo_suite.inference.hub import model_shape
    from dapo_suite.inference.models import EMBEDDED_NAME

    return model_shape(EMBEDDED_NAME if model == EMBEDDED_MODEL else model)


def _memory(config):
    """The memory check of the embedded trainer for `config` (`train.memory.check`), or None (said why) when
    the model's config.json is neither on this machine nor in the registry of dapo_suite/inference/hub.py."""
    from dapo_suite.inference.hub import looks_like_path
    from dapo_suite.train.memory import check, device_type, sizable

    shape = _model_shape(config.model)
    if shape is not None and sizable(shape):
        return check(config, shape, device_type(config.device))
    if not looks_like_path(config.model):  # a missing folder gets the loader's own message
        click.echo(
            f"memory: not estimated: no config.json of {config.model} on this machine, or not a Llama, Qwen2 "
            "or Qwen3 shape",
            err=True,
        )
    return None


def _memory_report(memory, config, ctx: click.Context) -> str:
    """The estimate against this machine's memory and, when it cannot fit, the command that does: this command
    with the changes that fit here, or on verl with the GPUs it needs."""
    import shlex

    lines = [memory.summary()]
    argv = ["dapo-suite", *ctx.meta.get("dapo_suite.argv", ["train"])]
    if memory.fits:
        if memory.estimate.peak > memory.available:
            lines.append("It may not fit beside what else runs now; other programs hold the rest.")
        return "\n".join(lines)
    if memory.fitting:
        changes = [
            arg
            for key, value in memory.fitting.items()
            for arg in ("--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}")
        ]
        lines.append(f"It cannot fit here. What fits: {shlex.join(argv + changes)}")
    elif memory.verl:
        data = [] if str(config.train_file).endswith(".parquet") else ["--train-file", "DATA.parquet"]
        command = shlex.join([*argv, "--backend", "verl", *memory.verl.flags, *data])
        lines.append(
            f"It cannot fit here, with LoRA or smaller micro-batches either. verl runs it on "
            f"{memory.verl.describe()}: {command}"
        )
    else:
        lines.append("It cannot fit here, nor on verl's largest layout: lower the lengths or the batch.")
    return "\n".join(lines)


def _echo_verl_memory(config, nnodes: int, gpus_per_node: int | None) -> None:
    """The GPUs verl needs for the model's training state (`train.memory.verl_plan`) against those asked
    for."""
    from dapo_suite.train.memory import sizable, verl_plan
    from dapo_suite.train.verl.gpus import GPUS_PER_NODE

    shape = _model_shape(config.model)
    if shape is None or not sizable(shape):
        click.echo(f"memory: not estimated: no config.json of {config.model} on this machine", err=True)
        return
    per_node = gpus_per_node or GPUS_PER_NODE
    plan = verl_plan(config, shape, per_node)
    asked = nnodes * per_node
    if plan is None:
        click.echo(
            f"warning: memory: this model's training state does not fit {GPUS_PER_NODE} x 64 GPUs", err=True
        )
    elif plan.hardware.gpus > asked:
        click.echo(f"warning: memory: verl needs {plan.describe()}; this run asks for {asked}", err=True)
    else:
        click.echo(f"memory: verl needs {plan.describe()}; this run asks for {asked}", err=True)


def _verl_device(
    device: str, nnodes: int, gpus_per_node: int | None, ray_address: str | None, gpu_layout: tuple
) -> str:
    """--device for verl; auto is cpu only for a local single-node run with no GPU visible here and no GPU
    layout asked for (--tp, --sp, --offload)."""
    gpu_flags = [
        name
        for name, value in zip(("--tp", "--sp", "--offload"), gpu_layout, strict=True)
        if value is not None
    ]
    if device == "cpu" and gpu_flags:
        raise click.UsageError(
            f"{', '.join(gpu_flags)} lay out GPUs; a --device cpu run has one process per logical "
            "GPU and no tensor or sequence parallelism: drop them"
        )
    if device != "auto":
        return device
    if ray_address or nnodes > 1 or gpus_per_node is not None or gpu_flags:
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _train_verl(config, passthrough: list[str], dry_run: bool, resume: bool, hardware: dict) -> None:
    """Build, validate and (unless --dry-run) launch the verl run; see dapo_suite/train/verl/."""
    from dapo_suite.train import verl as verl_backend

    hw = verl_backend.Hardware(**hardware)
    if not dry_run and not resume and (Path(config.out) / "checkpoints").is_dir():
        raise click.UsageError(
            f"{config.out} already holds a verl run: add --resume to continue it from its last "
            "checkpoint, or pick another --out"
        )
    try:
        if dry_run:
            plan = verl_backend.dry_run(config, hw, passthrough)
        else:
            code = verl_backend.launch(config, hw, passthrough)
            # read whatever the exit code: verl's fully async trainer ends cleanly when its rollouter stops
            reason = verl_backend.stop_reason(Path(config.out))
            if not reason and code == 0:
                reason = verl_backend.steps_short(Path(config.out), config.max_steps)
            if reason:
                raise click.ClickException(reason)
            raise SystemExit(code)
    except verl_backend.VerlConfigError as error:
        raise click.UsageError(str(error)) from error
    for note in plan["warnings"]:
        click.echo(f"warning: {note}", err=True)
    click.echo(plan["script"], nl=False)
    run_dir = plan["run_dir"]
    click.echo(
        f"resolved verl config: {run_dir / 'verl_config.yaml'}\ncommand: {run_dir / 'verl_command.sh'}"
    )


@train.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Target directory (default RUN_DIR/hf-export).")
def export(run_dir: str, out: str | None) -> None:
    """Write the newest checkpoint of RUN_DIR as a Hugging Face model directory.

    An embedded run: its last checkpoint, a LoRA run's adapters merged into the base model. A verl run: the
    newest FSDP actor checkpoint through verl's model merger
    (`python -m verl.model_merger merge --backend fsdp`). The result loads with transformers and is what
    `dapo-suite eval --model DIR` and `dapo-suite serve --model DIR` take.
    """
    import subprocess

    from dapo_suite.train import verl as verl_backend
    from dapo_suite.train.checkpoint import export_checkpoint, latest_checkpoint

    target = Path(out) if out else Path(run_dir) / "hf-export"
    if (checkpoint := latest_checkpoint(Path(run_dir))) is not None:
        click.echo(f"exported {checkpoint} to {export_checkpoint(checkpoint, target)}", err=True)
        click.echo(str(target))
        return
    try:
        actor = verl_backend.latest_actor_dir(Path(run_dir))
    except FileNotFoundError as error:
        raise click.UsageError(f"{error}; nor an embedded run's checkpoints/step-N") from error
    argv = verl_backend.export_command(actor, target)
    click.echo(" ".join(argv), err=True)
    code = subprocess.call(argv)
    if code:
        raise click.ClickException(f"verl's model merger failed with exit code {code}")
    click.echo(verl_backend.record_export(actor, target), err=True)
    click.echo(str(target))


# the studies' commands live beside this one: dapo_suite/train/studies_cli.py
train.add_command(ladder)
train.add_command(effects)
