"""The precision knobs checked by their numbers: the same training in fp32, TF32, bf16 and fp16, side by side.

    python -m benchmarks.precision                  # GPU: full-scale U-Net, fp32, TF32, bf16, fp16
    python -m benchmarks.precision --preset cpu     # CPU: the demo model, fp32, bf16 and fp16 autocast

Every rung trains the same model from the same initial weights on the same batches (on the
gpu-inmem loader) for ``--num_epochs`` and then validates once: the
validation loss, the L1 error of the gas density, and the power-spectrum ratio P_pred/P_true and
cross-correlation r(k) at the highest k bin, where precision would show first. Under fp16 it also
records the gradient scaler: its final scale and how many optimiser steps it skipped because the
scaled gradients overflowed (counted by reading the scale after every step, a host
synchronisation that train.py does not make). TF32 runs only on a CUDA GPU.

Results: ``benchmarks/results/precision/<device>-<date>.json`` and ``.md`` (refused if they exist:
``--out_dir`` elsewhere, or ``--overwrite``).
"""
import datetime
import functools
import os
import sys
import time

import torch

import train
from benchmarks.common import (NOT_IN_TREE, add_output_options, argument_parser, check_preset, claim_files,
                               committed_json, device_name, device_slug, free_name, make_data, results_folder,
                               write_report)
from utils import get_data_loader_distributed, lr_schedule, noise
from utils.YParams import load_params
from utils.conv3d import cpu_capability, emulated_on_cpu
from utils.estimate import emulated_16bit, format_duration
from utils.distributed import World
from utils.errors import exit_on_user_error
from utils.losses import build_loss
from utils.metrics import ValidationMetrics
from utils.optim import Precision, build_optimizer, set_learning_rate

PRESETS = {
    "gpu": {"options": ["--config=base", "--device=cuda", "--data_loader_config=gpu-inmem", "--Nsamples=4096",
                        "--Nsamples_val=512"], "box": 256, "num_epochs": 4,
            "rungs": {"fp32": ["--tf32=false"], "TF32": [], "bf16": ["--amp_mode=bf16"], "fp16": ["--amp_mode=fp16"]}},
    # 2 epochs of 128 crops: 32 steps. fp16 convolutions are slow on a CPU (about 10 times fp32's time per
    # step on the project's 2-core machine), so the CPU preset keeps the training short.
    "cpu": {"options": ["--config=demo", "--device=cpu", "--data_loader_config=gpu-inmem", "--Nsamples=128"],
            "box": 128, "num_epochs": 2,
            "rungs": {"fp32": [], "bf16": ["--amp_mode=bf16"], "fp16": ["--amp_mode=fp16"]}},
}


def train_and_validate(params, name=""):
    """Train ``params`` from seed ``params.seed`` and validate once; returns the rung's numbers. A line per
    epoch says how far it is (``name``: the rung's, for that line)."""
    device = train.pick_device(params, World())
    world = World()
    train_loader, val_loader = get_data_loader_distributed(params, 0, device)
    torch.manual_seed(params.seed)
    model = train.build_model(params, device)
    optimizer = build_optimizer(params, model)
    precision = Precision(params.amp_mode, device)
    loss_fn = build_loss(params)
    move = functools.partial(train.to_device, device=device, memory_format=train.memory_format(params))
    steps = params.num_epochs * len(train_loader)
    schedule = functools.partial(lr_schedule, total_steps=steps, params=params)
    train_step = train.default_step(model, optimizer, loss_fn, precision, params)
    scaler, skipped, step, losses = precision.scaler, 0, 0, []
    started = time.perf_counter()
    for epoch in range(params.num_epochs):
        train_loader.sampler.set_epoch(epoch)
        for inputs, targets in train_loader:
            set_learning_rate(optimizer, schedule(step))
            scale = scaler.get_scale() if scaler.is_enabled() else None
            losses.append(train_step(move(inputs), move(targets)))
            if scale is not None and scaler.get_scale() < scale:  # waits for the device: a skipped step
                skipped += 1
            step += 1
        # Progress, once an epoch: the float waits for the device, outside the steps' loop.
        print(f"{name} epoch {epoch + 1}/{params.num_epochs}: {step} steps, last training loss "
              f"{float(losses[-1]):.6f}, {time.perf_counter() - started:.0f} s", flush=True)
    metrics = ValidationMetrics()
    val_loss, _ = train.validate(model, val_loader, loss_fn, precision, move, world, metrics=metrics)
    values = metrics.compute()
    top_k = sorted(name[len("rk_k"):] for name in values if name.startswith("rk_k"))
    top_k = max(top_k, key=float)
    return {"steps": step, "last_train_loss": float(losses[-1]), "val_loss": val_loss,
            "L1_density": values["L1_gas_density"],
            "k_top": float(top_k), "Pk_ratio_top": values[f"Pk_ratio_k{top_k}"], "rk_top": values[f"rk_k{top_k}"],
            "final_scale": scaler.get_scale() if scaler.is_enabled() else None,
            "skipped_steps": skipped if scaler.is_enabled() else None}


# What the spectral columns mean, above the table.
COLUMNS = ("'P ratio at top k': P_pred(k) / P_true(k), the power spectrum of the predicted gas overdensity over "
           "that of the true one in the highest k bin (the smallest scales, where lost precision would show "
           "first): 1 is the true amount of small-scale structure, above 1 more of it (noise), below 1 less "
           "(smoothing). 'r(k) at top k': the cross-correlation coefficient of prediction and truth in that "
           "bin: 1 when their small-scale structure lines up, 0 when it is unrelated.")


def markdown(report):
    reference = report["rungs"][0]["val_loss"]
    lines = [f"Measured by `{report['command']}` on {report['device']} (torch {report['torch']}), "
             f"{report['date']}: config {report['config']}, {report['num_epochs']} epochs, "
             f"{report['rungs'][0]['steps']} steps per rung, the same initial weights and batches in every rung.", "",
             COLUMNS, "",
             "| precision | validation loss | vs fp32 | L1 gas density | P ratio at top k | r(k) at top k "
             "| final scale | skipped steps |",
             "|---|---|---|---|---|---|---|---|"]
    for rung in report["rungs"]:
        def cell(value, fmt):
            return "n/a" if value is None else format(value, fmt)
        lines.append(f"| {rung['name']} | {rung['val_loss']:.6f} | {rung['val_loss'] / reference - 1:+.2%} "
                     f"| {rung['L1_density']:.6f} | {rung['Pk_ratio_top']:.4f} | {rung['rk_top']:.4f} "
                     f"| {cell(rung['final_scale'], '.0f')} | {cell(rung['skipped_steps'], 'd')} |")
    lines += ["", f"Top k bin: {report['rungs'][0]['k_top']:.3g} rad/cell. 'vs fp32': the validation loss's "
              "relative difference from the first rung's."]
    return "\n".join(lines) + "\n"


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, PRESETS)
    add_output_options(parser, "benchmarks/results/precision", "precision")
    parser.add_argument("--num_epochs", type=int, default=None, help="epochs per rung (default: the preset's)")
    args, options = parser.parse_known_args(argv)
    check_preset(args.preset)
    preset = PRESETS[args.preset]
    name = device_name(args.preset == "gpu")
    stamp = datetime.datetime.now(datetime.timezone.utc)
    base = free_name(os.path.join(results_folder(args, "benchmarks/results/precision", "precision"),
                                  f"{device_slug(name)}-{stamp:%Y-%m-%d}"), args,
                     lambda b: any(os.path.exists(b + suffix) for suffix in (".json", ".md")))
    claim_files([base + ".json", base + ".md"], args.overwrite, earlier="an earlier run on this device today")
    train_path, val_path = make_data(args.data_dir, preset["box"])
    num_epochs = args.num_epochs or preset["num_epochs"]
    common = [*preset["options"], f"--train_path={train_path}", f"--val_path={val_path}", f"--num_epochs={num_epochs}",
              "--checkpoint=false", *options]
    report = {"device": name, "torch": torch.__version__, "date": stamp.isoformat(timespec="seconds"),
              "command": "python -m benchmarks.precision " + " ".join(sys.argv[1:] if argv is None else argv),
              "config": load_params(common).config_name, "num_epochs": num_epochs, "rungs": []}
    fp32_seconds = None
    for rung, extra in preset["rungs"].items():
        params = load_params([*common, *extra])
        print(f"=== {rung}{emulated_note(params, fp32_seconds) if args.preset == 'cpu' else ''}", flush=True)
        started = time.perf_counter()
        result = train_and_validate(params, rung)
        fp32_seconds = fp32_seconds or time.perf_counter() - started  # the first rung's, fp32
        report["rungs"].append({"name": rung, "options": extra, **result})
        print(f"{rung}: validation loss {result['val_loss']:.6f}", flush=True)
    write_report(base, report, markdown(report))
    line = compare_line(report) if args.preset == "cpu" else None
    if line:
        print(line)


def emulated_note(params, fp32_seconds):
    """For a 16-bit rung this CPU emulates: why it is slow and how long it will take, said before it starts."""
    emulated = emulated_16bit(params, params.global_batch_size)
    if emulated is None:
        return ""
    expect = f"; expect about {format_duration(fp32_seconds * emulated.slowdown)}" if fp32_seconds else ""
    return (f" (this CPU has no native {emulated.mode}, PyTorch's kernels use {cpu_capability()}: PyTorch's generic "
            f"reference code computes it, {emulated.slowdown:.0f} times as slow as fp32 at the rates measured just "
            f"now{expect})")


# The committed runs whose bf16 against fp32 the README's CPU track quotes (step 4): on a CPU whose bf16
# convolutions run in oneDNN, and on one that emulates bf16 (AVX2 only). Their fp16 rungs (emulated on both)
# agree to the last bit and their fp32 rungs to six digits; the bf16 rungs differ in the fourth.
REFERENCE = {False: os.path.join("benchmarks", "results", "precision", "cpu-vm-2-cores-2026-11-25.json"),
             True: os.path.join("benchmarks", "results", "precision", "cpu-vm-2-cores-avx2-2026-11-29.json")}


def bf16_difference(report):
    """bf16's validation loss relative to fp32's, None without both rungs."""
    loss = {rung["name"]: rung["val_loss"] for rung in report["rungs"]}
    return loss["bf16"] / loss["fp32"] - 1 if {"fp32", "bf16"} <= set(loss) else None


def compare_line(report):
    """The README's number here and in the committed run. Validation losses are not timed: the machine's
    load does not change them, and there are no trials to judge."""
    here = bf16_difference(report)
    if here is None:
        return None
    path = REFERENCE[emulated_on_cpu("bf16")]
    committed = committed_json(path)
    reference = bf16_difference(committed) if committed else None
    return noise.compare_line("bf16's validation loss against fp32's", f"{here:+.2%}",
                              NOT_IN_TREE if reference is None else f"{reference:+.2%}", path)


if __name__ == "__main__":
    main()
