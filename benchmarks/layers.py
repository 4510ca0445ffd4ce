"""The U-Net layer by layer: FLOPs, time and achieved TFLOP/s of every convolution, forward + backward,
and of each slow layer's exact form beside it.

    python -m benchmarks.layers                          # GPU: full-scale U-Net, batch 64, crop 64, bf16
    python -m benchmarks.layers --preset cpu             # CPU: the demo model, batch 8, crop 32, fp32
    python -m benchmarks.layers --amp_mode=fp16          # any train.py option changes the configuration
    python -m benchmarks.layers --flops                  # no timing, any machine: FLOPs and arithmetic intensity

Each convolution runs alone, forward and backward, on a random input of the shape and dtype it sees in the
network (with a gradient, except the first layer's, as in training), in the configured precision;
its FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode``. They add up to the whole
model's count (80.5 GFLOP per 64^3 sample at full scale), which the table checks. Beside each
layer: the time per batch, the TFLOP/s it achieves, and its share of a whole training step (the
same batch through ``train.py``'s step, optimiser included, timed alone). On a GPU this shows
where the model FLOP utilisation goes: the thin first and last layers (4 and 5 channels) use
tensor cores poorly, and the deep layers see tiny spatial sizes. The layers that have an exact
faster form (utils/exact_forms.py: the first convolution, every transposed convolution) are timed
in it as well, on the same input: the two times side by side say which form pays on this device,
as ``--exact_forms=auto`` decides for a training run. The whole step is timed as ``train.py`` builds
it, with the forms ``--exact_forms`` picks.

Then the step is profiled layer by layer (benchmarks/in_step.py, ``--in_step_steps``) three times:
the layers plain (``--exact_forms=off``), as ``auto`` picks them on this device (what a run computes),
and all in their exact forms (``on``); and a fourth time with the list of layers ``--exact_forms=[...]``
names, where it names one (to measure a choice of your own, e.g. ``[down.0.0,last]``). Each layer's row
holds its form's own work beside its
convolution. The step runs with the options' ``--jit_mode``: compiled, the layers are found by their
convolutions' shapes.

Results: ``benchmarks/results/layers/<device>-<date>-<precision>.json`` and ``.md`` (refused if
they exist: ``--out_dir`` elsewhere, or ``--overwrite``), written as each part is measured (the layer
table, then each table of the step), so that a run cut off keeps the parts it finished.
"""
import datetime
import json
import os
import sys
import time

import torch

import train
from benchmarks import in_step
from benchmarks.common import (add_output_options, argument_parser, check_preset, claim_files, device_name,
                               device_slug, free_name, results_folder, software, software_text)
from utils.YParams import load_params
from utils.conv3d import check_conv3d, running_precision
from utils.distributed import World
from utils.errors import exit_on_user_error
from utils.estimate import cpu_model
from utils.exact_forms import ExactConv, convolution_inputs, exact_form, option_text
from utils.files import atomic_path
from utils.flops import resolve_peak_flops, unet_flops_per_sample
from utils.losses import build_loss
from utils.optim import Precision, build_optimizer

PRESETS = {
    "gpu": {"options": ["--config=base", "--amp_mode=bf16", "--device=cuda"], "repeats": 20},
    "cpu": {"options": ["--config=demo", "--device=cpu"], "repeats": 3},
}
# The tables of the step layer by layer: the layers plain, as --exact_forms=auto picks them (what a run
# computes), and all in their exact forms; then the list of layers the options name, if they name one.
IN_STEP_FORMS = ("off", "auto", "on")


def in_step_settings(exact_forms):
    """The --exact_forms settings the step is profiled with: IN_STEP_FORMS, and the options' own list."""
    return [*IN_STEP_FORMS, *([option_text(exact_forms)] if isinstance(exact_forms, list) else [])]


def convolutions(model):
    """``(name, module)`` of every convolution, in the order the forward pass runs them."""
    layers = [(f"down {i + 1}", block[0]) for i, block in enumerate(model.down)]
    layers += [(f"up {len(model.up) - i}", block[0]) for i, block in enumerate(model.up)]
    return layers + [("last", model.last)]


def input_shapes(params, batch):
    """The input shape of each convolution in a forward pass of ``batch`` samples (on the meta device)."""
    model, shapes = convolution_inputs(params, batch, [params.crop_size] * 3)
    names = {module: name for name, module in model.named_modules()}
    return model, {name: shapes[names[module]] for name, module in convolutions(model)}


def layer_flops(params, batch):
    """``[(name, module, input shape, forward + backward FLOPs)]`` per convolution; counted on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    model, shapes = input_shapes(params, batch)
    rows = []
    for index, (name, module) in enumerate(convolutions(model)):
        counter = FlopCounterMode(display=False)
        with counter:
            x = torch.empty(shapes[name], device="meta", requires_grad=index > 0)  # the data needs no gradient
            module(x).sum().backward()
        rows.append((name, module, tuple(shapes[name]), float(counter.get_total_flops())))
    return rows


def flop_table(params, batch):
    """Markdown: each convolution's training GFLOP per sample, share of the model's, and the arithmetic
    intensity of its forward pass at ``batch`` (FLOPs per byte of input, output and weights moved once,
    in the precision's element size). A calculation from the shapes: nothing runs."""
    element = 2 if params.amp_mode in ("bf16", "fp16") else 4
    rows = layer_flops(params, batch)
    total = sum(flops for *_, flops in rows)
    lines = [f"Training FLOPs per sample at crop {params.crop_size}^3 (forward + backward; the first layer computes "
             f"no input gradient), and forward arithmetic intensity at batch {batch} with {element}-byte elements.",
             "", "| layer | channels | side in -> out | GFLOP per sample | share | FLOP per byte (forward) |",
             "|---|---|---|---|---|---|"]
    for index, (name, module, shape, flops) in enumerate(rows):
        transposed = isinstance(module, torch.nn.ConvTranspose3d)
        side = shape[-1]
        out_side = 2 * side if transposed else side // 2
        forward = flops / (2 if index == 0 else 3)  # backward: weight gradient (+ input gradient) = 1 (2) forwards
        moved = element * (batch * module.in_channels * side ** 3 + batch * module.out_channels * out_side ** 3
                           + module.weight.numel())
        lines.append(f"| {name} | {module.in_channels} -> {module.out_channels} | {side} -> {out_side} "
                     f"| {flops / batch / 1e9:.2f} | {flops / total:.1%} | {forward / moved:.0f} |")
    transposed = sum(flops for _, module, _, flops in rows if isinstance(module, torch.nn.ConvTranspose3d))
    lines += ["", f"Transposed convolutions: {transposed / total:.1%} of the FLOPs; all convolutions: "
              f"{total / batch / 1e9:.2f} GFLOP per sample."]
    return "\n".join(lines) + "\n"


def time_it(function, device, repeats):
    """Mean seconds per call after two untimed calls; the device is synchronised around the timed ones."""
    for _ in range(2):
        function()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # waits for the device: the calls' work is inside the timing
    return (time.perf_counter() - start) / repeats


def layer_call(module, shape, first, precision, device, memory_format, form=None):
    """One forward + backward of a layer shaped as ``module``, computed in ``form`` (None: plain), as a function.
    Its input is of the dtype the layer sees in training: the data's float32 for the first layer, the autocast
    dtype (the layer before's output) for the others, so that no cast of the input is timed that a step does not
    make; its gradients are returned, never accumulated, as a step's backward writes them."""
    layer = type(module)(module.in_channels, module.out_channels, kernel_size=4, stride=2, padding=1)
    layer = layer.to(device, memory_format=memory_format)
    layer = layer if form is None else ExactConv(layer, form)
    dtype = torch.float32 if first or precision.dtype is None else precision.dtype
    x = torch.randn(shape, device=device).to(dtype=dtype, memory_format=memory_format).requires_grad_(not first)
    inputs = [*([] if first else [x]), *layer.parameters()]
    grad = []

    def forward_backward():
        with precision.autocast():
            out = layer(x)
        grad[:] = grad or [torch.ones_like(out)]  # made once: the step's loss hands its gradient over
        return torch.autograd.grad(out, inputs, grad[0])

    return forward_backward


def time_rounds(functions, device, repeats, rounds):
    """Seconds per call of each function: the least of ``rounds`` means (:func:`time_it`), the rounds taking
    the functions in turn, so that a busy spell of a shared machine weighs on each of them alike."""
    best = [float("inf")] * len(functions)
    for _ in range(rounds):
        for index, function in enumerate(functions):
            best[index] = min(best[index], time_it(function, device, repeats))
    return best


def training_step(params, device, batch):
    """``(model, step, inputs, targets)``: train.py's step (model, loss, backward, Adam) on a random batch."""
    model = train.build_model(params, device)
    optimizer = build_optimizer(params, model)
    precision = Precision(params.amp_mode, device)
    step = train.default_step(model, optimizer, build_loss(params), precision, params)
    memory_format = train.memory_format(params)
    inputs = torch.randn(batch, params.N_in_channels, *[params.crop_size] * 3, device=device)
    targets = torch.randn(batch, params.N_out_channels, *[params.crop_size] * 3, device=device)
    return model, step, inputs.to(memory_format=memory_format), targets.to(memory_format=memory_format)


def time_step(params, device, batch, repeats):
    """Seconds of one whole training step as train.py takes it."""
    _, step, inputs, targets = training_step(params, device, batch)
    return time_it(lambda: step(inputs, targets), device, repeats)


def load_average():
    """The host's 1-minute load average, or None where the system keeps none: work that shares the machine
    shows here, and in every time measured beside it."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def form_of(module):
    """The form a layer computes in: its exact form's name, or "plain"."""
    return module.form.name if isinstance(module, ExactConv) else "plain"


def in_step_table(options, device, steps, forms):
    """The step profiled layer by layer (benchmarks/in_step.py), with ``--exact_forms=forms`` and the options'
    ``--jit_mode`` (compiled: the layers found by their convolutions' shapes); the table says which form each
    layer computes in (``auto`` picks them on the device)."""
    params = load_params([*options, f"--exact_forms={forms}"])
    model, step, inputs, targets = training_step(params, device, params.global_batch_size)
    layers = convolutions(model)
    shapes = in_step.convolution_shapes(model, inputs, layers) if params.jit_mode == "compile" else None
    table = in_step.profile_step(step, inputs, targets, layers, device, steps, layer_of_shapes=shapes)
    return {"exact_forms": forms, "jit_mode": params.jit_mode, "forms": {name: form_of(m) for name, m in layers},
            **table}


def measure(params, device, repeats, rounds=1):
    batch = params.global_batch_size
    precision = Precision(params.amp_mode, device)
    memory_format = train.memory_format(params)
    rows = []
    for index, (name, module, shape, flops) in enumerate(layer_flops(params, batch)):
        form = exact_form(module)
        calls = [layer_call(module, shape, index == 0, precision, device, memory_format, each)
                 for each in ([None] if form is None else [None, form])]
        seconds, form_seconds = (time_rounds(calls, device, repeats, rounds) + [None])[:2]
        kind = "ConvTranspose3d" if isinstance(module, torch.nn.ConvTranspose3d) else "Conv3d"
        rows.append({"layer": name, "kind": kind, "in_channels": module.in_channels,
                     "out_channels": module.out_channels, "input_side": shape[-1], "gflop": flops / 1e9,
                     "ms": 1e3 * seconds, "tflops": flops / seconds / 1e12,
                     "exact_form": form and form.name, "exact_form_ms": form and 1e3 * form_seconds})
    step_seconds = time_step(params, device, batch, repeats)
    for row in rows:
        row["share_of_step"] = row["ms"] / 1e3 / step_seconds
    return rows, step_seconds


def markdown(report):
    cpu = f", {report['cpu_model']}" if report.get("cpu_model") else ""
    lines = [f"Measured by `{report['command']}` on {report['device']}{cpu} ({software_text(report)}), "
             f"{report['date']}: batch {report['batch']}, crop {report['crop']}^3, {report['precision']}, "
             f"--exact_forms={report['exact_forms']}. Each convolution forward + backward alone, on an input of the dtype "
             "the step gives it, its gradients not accumulated, plain and, where it has one, in its exact form "
             "(utils/exact_forms.py); "
             f"ms: the mean of {report['repeats']} calls" + (f", the least of {report['rounds']} rounds taking "
             "plain and exact form in turn" if report["rounds"] > 1 else "") + "; share: of one whole training step.",
             "",
             "| layer | kind | channels | input side | GFLOP | ms | TFLOP/s | share of the step | exact form "
             "| its ms | plain / exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["layers"]:
        exact = (f"{row['exact_form']} | {row['exact_form_ms']:.2f} | {row['ms'] / row['exact_form_ms']:.2f}"
                 if row.get("exact_form") else "| |")
        lines.append(f"| {row['layer']} | {row['kind']} | {row['in_channels']} -> {row['out_channels']} "
                     f"| {row['input_side']} | {row['gflop']:.2f} | {row['ms']:.2f} | {row['tflops']:.2f} "
                     f"| {row['share_of_step']:.1%} | {exact} |")
    total = report["total"]
    lines += [f"| all convolutions | | | | {total['gflop']:.2f} | {total['ms']:.2f} | {total['tflops']:.2f} "
              f"| {total['share_of_step']:.1%} | | | |",
              f"| training step | | | | {total['model_gflop']:.2f} | {total['step_ms']:.2f} "
              f"| {total['step_tflops']:.2f} | 100.0% | | | |", "",
              f"The layers' FLOPs add up to the model's: {total['gflop']:.3f} GFLOP = {total['model_gflop']:.3f} "
              f"GFLOP per batch ({total['model_gflop'] / report['batch']:.2f} GFLOP per sample)."
              + (f" Model FLOP utilisation of the step: {total['mfu']:.1%} of {report['peak_tflops']:g} TFLOP/s."
                 if total.get("mfu") is not None else "")]
    load = report.get("load_average") or {}
    if load.get("start") is not None:
        lines += ["", f"The host's 1-minute load average on its {load['cpus']} cores: {load['start']:.2f} when the "
                  f"measurement began, {load['end']:.2f} when this part was written."]
    for table in report.get("in_step", {}).values():
        lines += ["", in_step.markdown(table, in_step_title(table)).rstrip("\n")]
        if table.get("load_average") is not None:
            lines[-1] += f" The host's 1-minute load average as the table was done: {table['load_average']:.2f}."
    if report.get("in_step_pending"):
        lines += ["", "Not measured, the run having stopped before them: the step layer by layer with "
                  + ", ".join(f"--exact_forms={forms}" for forms in report["in_step_pending"]) + "."]
    return "\n".join(lines) + "\n"


def in_step_title(table):
    """The title of a table of the step layer by layer: its --exact_forms, the forms it ran, the --jit_mode."""
    chosen = [f"{name} {form}" for name, form in table["forms"].items() if form != "plain"]
    forms = f"in their exact forms ({', '.join(chosen)})" if chosen else "all plain"
    return (f"The step layer by layer, --exact_forms={table['exact_forms']}, --jit_mode={table['jit_mode']}: "
            f"the layers {forms}")


@exit_on_user_error
def main(argv=None):
    parser = argument_parser(__doc__, PRESETS)
    add_output_options(parser, "benchmarks/results/layers", "layers")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per layer (default: the preset's)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time each layer (and its exact form, in turn) this many times and keep the least mean: "
                             "for a machine shared with other work")
    parser.add_argument("--flops", action="store_true", help="print the FLOP table only: no timing, no GPU needed")
    parser.add_argument("--in_step_steps", type=int, default=3,
                        help="steps profiled for the tables of the step layer by layer, with --exact_forms=off, "
                             "auto and on (benchmarks/in_step.py); 0: none")
    args, options = parser.parse_known_args(argv)
    if args.flops:
        params = load_params(["--config=base", *options])
        print(flop_table(params, params.global_batch_size), end="")
        return
    check_preset(args.preset)
    resolved = [*PRESETS[args.preset]["options"], *options]
    params = load_params(resolved)
    train.check_crop_size(params)
    device = train.pick_device(params, World())  # cuDNN autotuning and TF32 as the options say
    precision = running_precision(params.amp_mode, params.tf32, device)  # the MFU's peak is this one's
    stamp = datetime.datetime.now(datetime.timezone.utc)
    name = device_name(device.type == "cuda")
    base = free_name(os.path.join(results_folder(args, "benchmarks/results/layers", "layers"),
                                  f"{device_slug(name)}-{stamp:%Y-%m-%d}-{precision}"), args,
                     lambda b: any(os.path.exists(b + suffix) for suffix in (".json", ".md")))
    claim_files([base + ".json", base + ".md"], args.overwrite, earlier="an earlier run on this device today")

    warnings = check_conv3d(device, params.amp_mode, params.tf32, params.channels_last)
    load = {"start": load_average(), "cpus": os.cpu_count()}
    settings = in_step_settings(params.exact_forms) if args.in_step_steps > 0 else []  # before auto decides
    rows, step_seconds = measure(params, device, args.repeats or PRESETS[args.preset]["repeats"], args.rounds)
    batch = params.global_batch_size
    flops, model_flops = sum(row["gflop"] for row in rows) * 1e9, unet_flops_per_sample(params) * batch
    if abs(flops - model_flops) > 1e-6 * model_flops:
        raise AssertionError(f"the layers' FLOPs ({flops:.6g}) do not add up to the model's ({model_flops:.6g})")
    peak, _ = resolve_peak_flops(device, precision)
    seconds = sum(row["ms"] for row in rows) / 1e3
    report = {"device": name, **software(), "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
              "date": stamp.isoformat(timespec="seconds"), "batch": batch, "crop": params.crop_size,
              "precision": precision, "exact_forms": option_text(params.exact_forms),
              "repeats": args.repeats or PRESETS[args.preset]["repeats"], "rounds": args.rounds,
              "cpu_model": None if device.type == "cuda" else cpu_model(),
              "conv3d_warnings": warnings, "peak_tflops": peak / 1e12 if peak else None,
              "command": "python -m benchmarks.layers " + " ".join(sys.argv[1:] if argv is None else argv),
              "load_average": load, "layers": rows, "in_step": {}, "in_step_pending": settings,
              "total": {"gflop": flops / 1e9, "ms": 1e3 * seconds, "tflops": flops / seconds / 1e12,
                        "share_of_step": seconds / step_seconds, "model_gflop": model_flops / 1e9,
                        "step_ms": 1e3 * step_seconds, "step_tflops": model_flops / step_seconds / 1e12,
                        "mfu": model_flops / step_seconds / peak if peak else None}}
    # Each part on disk as soon as it is measured: a run cut off keeps the layer table and the finished tables.
    save(base, report)
    while report["in_step_pending"]:
        forms = report["in_step_pending"][0]
        report["in_step"][forms] = {**in_step_table(resolved, device, args.in_step_steps, forms),
                                    "load_average": load_average()}
        report["in_step_pending"].pop(0)
        save(base, report)
    print(markdown(report))
    print(f"Results: {base}.json, {base}.md")


def save(base, report):
    """``<base>.json`` (the report) and ``<base>.md`` (its tables), each replaced whole (utils/files.py)."""
    os.makedirs(os.path.dirname(base), exist_ok=True)
    report["load_average"]["end"] = load_average()
    for suffix, text in ((".json", json.dumps(report, indent=1)), (".md", markdown(report))):
        with atomic_path(base + suffix) as temporary, open(temporary, "w") as f:
            f.write(text)

if __name__ == "__main__":
    main()
