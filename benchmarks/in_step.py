"""Where one real training step's time goes, layer by layer: the profiler's own events of a few steps,
each kernel (on a CPU: each operator's own time) attributed to its layer, to the layout conversions
outside the layers, to the other element-wise work or to the optimiser.

``benchmarks.layers`` times each convolution alone, on its own input; its deepest rows are mostly a
call's fixed cost, and it cannot see what the step does between the layers. Here nothing runs alone:
train.py's step (forward, loss, backward, Adam) runs as it trains, with the profiler on, and

- forward: a range ``layer: <name>`` around each layer (a forward pre-hook opens it, the forward hook
  closes it) holds the operators that layer launches: its convolution and, in an exact form
  (utils/exact_forms.py), the form's own work: pads, flips, voxel and weight reshuffles, the bias
  repeated per parity, and under autocast the casts;
- backward: autograd runs each operator's backward under ``autograd::engine::evaluate_function: X``
  and, inside it, the node's own range ``X``, both with the forward operator's sequence number, so the
  backward of every operator that ran in a layer's range goes to that layer (the profiler's
  correlation, no backward hooks): the convolution's and the form's (the pad's crop, the reshuffles
  undone, the bias gradient summed per parity). What autograd runs beside a node's own range, the sum
  of two gradients of one tensor (a skip connection's), is no layer's work;
- the optimiser's work runs under torch's own ``Optimizer.step#...`` and ``Optimizer.zero_grad#...``.

A layer's row holds all its work; the column beside it says how much of it is not the convolution's
own (the form's work, the casts, the layout conversions the convolution makes). Outside the layers,
a kernel is a layout conversion where its name says so (cuDNN's ``nchwToNhwc``/``nhwcToNchw``,
transposes) or its operator is a ``contiguous``/``clone`` copy, and other element-wise work otherwise.
The rows add up to the measured step: the steps' wall time, synchronised, of which what no kernel (on
a CPU: no operator) covers is its own row (the device idle while the host launches; on a CPU, Python
between the operators).

Under ``--jit_mode=compile`` hooks do not run inside the compiled graph and the backward is one
compiled node, so the layers are found by their convolutions' shapes instead (:func:`convolution_shapes`:
the input's and the weight's, learnt from one eager forward pass, unique per layer in the U-Net);
``aten::convolution`` and ``aten::convolution_backward`` still run as operators of their own. A layer's
row then holds its convolution, forward and backward; the forms' work is fused with the activations
into the compiled graph's kernels (on a CPU, the graph's own time), in the other element-wise row.

``benchmarks.layers`` runs it; alone, this module reads a GPU trace that a profile already wrote (a
``.pt.trace.json[.gz]`` of ``train.py --profiler=torch`` or ``benchmarks.profiles``) and sorts its
kernels by their names alone:

    python -m benchmarks.in_step sample_nsys_profiles/gpu_inmem_bf16.pt.trace.json.gz
"""
import argparse
import gzip
import json
import re
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

LAYER = "layer: "
BACKWARD = "autograd::engine::evaluate_function: "
OPTIMISER = ("Optimizer.step#", "Optimizer.zero_grad#")
COMPILED_GRAPH = "## Call CompiledFxGraph"  # on a CPU its own time is that of the graph's fused C++ kernels
# Torch 2.4 has no range of its own around a compiled graph's call: its fused kernels' time is then the own
# time of AOTAutograd's ranges around the call (CompiledFunction, CompiledFunctionBackward).
OLDER_COMPILED_GRAPH = "CompiledFunction"
FUSED = "compiled graph (its fused kernels)"
LAYOUT_KERNEL = re.compile(r"nchwToNhwc|nhwcToNchw|transpose|permute", re.I)
CONV_KERNEL = re.compile(r"conv|xmma|implicit_gemm|dgrad|wgrad|fprop|cudnn|cutlass", re.I)
CONV_OP = re.compile(r"conv", re.I)
LAYOUT_OPS = ("aten::contiguous", "aten::clone")
# Where a convolution's operators take the input and the weight among their arguments.
CONVOLUTION_ARGUMENTS = {"aten::convolution": (0, 1), "aten::convolution_backward": (1, 2)}
ARCHITECTURE = re.compile(r"(?<![a-z0-9])sm_?(\d{2,3})|cutlass_(\d{2,3})_", re.I)
GENERATIONS = {"volta": "70", "turing": "75", "ampere": "80", "hopper": "90", "blackwell": "100"}
ROWS_AFTER = ("layout conversions", "other element-wise", "optimiser")
# A GPU's profile without a kernel: the profiler could not trace the device (CUPTI), and the rows measure nothing.
NO_KERNELS = ("The profiler recorded no GPU kernel here (CUPTI traced nothing on this machine): the rows are not "
              "measured, only the step's wall time is.")


def architecture(kernel):
    """The GPU generation a kernel was written for, ``sm80``, ``sm90``, ..., from its name (cuDNN's ``sm90_xmma_...``,
    CUTLASS's ``cutlass_80_...``, cuBLAS's ``ampere_...``), or ``""`` where the name does not say."""
    found = ARCHITECTURE.search(kernel)
    if found:
        return "sm" + (found.group(1) or found.group(2))
    generation = next((number for name, number in GENERATIONS.items() if kernel.lower().startswith(name + "_")), None)
    return f"sm{generation}" if generation else ""


class LayerRanges:
    """Forward hooks that open a profiler range ``layer: <name>`` around each layer's forward."""

    def __init__(self, layers):
        self.open, self.hooks = {}, []
        for name, module in layers:
            self.hooks += [module.register_forward_pre_hook(self.opener(name)),
                           module.register_forward_hook(self.closer(name))]

    def opener(self, name):
        def hook(module, args):
            self.open[name] = record_function(LAYER + name)
            self.open[name].__enter__()
        return hook

    def closer(self, name):
        def hook(module, args, output):
            self.open.pop(name).__exit__(None, None, None)
        return hook

    def remove(self):
        for hook in self.hooks:
            hook.remove()


def ancestors(event):
    """The event and its enclosing CPU events, innermost first."""
    while event is not None:
        yield event
        event = event.cpu_parent


def layer_range(event):
    """The layer whose ``layer: <name>`` range holds ``event``, or None."""
    return next((each.name[len(LAYER):] for each in ancestors(event) if each.name.startswith(LAYER)), None)


def convolution_key(event):
    """``(input shape, weight shape)`` of a convolution's forward or backward operator; None for any other."""
    where = CONVOLUTION_ARGUMENTS.get(event.name)
    shapes = event.input_shapes or []
    if where is None or len(shapes) <= max(where):
        return None
    return tuple(tuple(shapes[index]) for index in where)


def context(event, layer_of_sequence, layer_of_shapes):
    """``(layer or None, optimiser?, under a layout copy?, under a convolution?)`` of a CPU operator."""
    layer, optimiser, layout, conv, inner = None, False, False, False, None
    for each in ancestors(event):
        name = each.name
        if name.startswith(LAYER):
            layer = layer or name[len(LAYER):]
        elif name.startswith(BACKWARD) and inner is not None and inner.name == name[len(BACKWARD):]:
            layer = layer or layer_of_sequence.get(each.sequence_nr)  # inside the node's own range
        elif name.startswith(OPTIMISER):
            optimiser = True
        elif name in CONVOLUTION_ARGUMENTS and layer_of_shapes:
            layer = layer or layer_of_shapes.get(convolution_key(each))
        layout = layout or name in LAYOUT_OPS
        conv = conv or (name.startswith("aten::") and CONV_OP.search(name) is not None)
        inner = each
    return layer, optimiser, layout, conv


def forward_sequences(events):
    """{sequence number: layer} of the forward operators that ran inside a layer's range."""
    found = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith(BACKWARD):
            layer = layer_range(event)
            if layer is not None:
                found.setdefault(event.sequence_nr, layer)
    return found


def convolution_shapes(model, inputs, layers):
    """{(input shape, weight shape): layer} of the convolution each of ``layers`` (``[(name, module)]``) runs,
    read from the operators' shapes in one eager forward pass of ``model`` (no gradients); refused where two
    layers' convolutions have the same shapes, which would make the attribution ambiguous."""
    ranges = LayerRanges(layers)
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
            model(inputs)
    finally:
        ranges.remove()
    found = {}
    for event in profiler.events():
        key, layer = convolution_key(event), layer_range(event)
        if key is None or layer is None:
            continue
        if found.setdefault(key, layer) != layer:
            raise ValueError(f"layers {found[key]} and {layer} run convolutions of the same shapes {key}: "
                             "a compiled step's convolutions cannot be told apart by their shapes")
    return found


def compiled_graph_range(events):
    """The name (a prefix) of the ranges whose own CPU time is a compiled graph's fused kernels, in the torch
    that recorded ``events``."""
    return COMPILED_GRAPH if any(event.name.startswith(COMPILED_GRAPH) for event in events) else OLDER_COMPILED_GRAPH


def units(events, cuda):
    """``(name, microseconds, launching CPU event)`` of each piece of timed work: the kernels on a GPU; on a
    CPU, each operator's own time (its children's excluded) and a compiled graph's own time (its fused
    kernels), ranges of Python code (``layer: ...``, ``Optimizer...``, autograd's nodes) left out, their
    time being that of the operators inside them."""
    graph = compiled_graph_range(events)
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue
        if cuda:
            for kernel in event.kernels:
                yield kernel.name, kernel.duration, event
        elif event.self_cpu_time_total > 0 and event.name.startswith(("aten::", graph)):
            yield FUSED if event.name.startswith(graph) else event.name, event.self_cpu_time_total, event


def attribute(events, layer_names, cuda, layer_of_shapes=None):
    """{row: {"us": time, "around_us": a layer's work that is not its convolution's, "kernels": {name: us}}}.
    ``layer_of_shapes`` (:func:`convolution_shapes`): the layers found by their convolutions' shapes, for a
    compiled step, whose events hold no layer ranges."""
    layer_of_sequence = forward_sequences(events)
    rows = {name: {"us": 0.0, "around_us": 0.0, "kernels": defaultdict(float)}
            for name in [*layer_names, *ROWS_AFTER]}
    for name, us, event in units(events, cuda):
        layer, optimiser, under_layout, under_conv = context(event, layer_of_sequence, layer_of_shapes)
        layout = under_layout or LAYOUT_KERNEL.search(name) is not None
        if optimiser:
            row = "optimiser"
        elif layer is not None:
            row = layer
            if layout or not under_conv:
                rows[layer]["around_us"] += us
        elif layout:
            row = "layout conversions"
        else:
            row = "other element-wise"
        rows[row]["us"] += us
        rows[row]["kernels"][name] += us
    return rows


def range_span(event, range_names):
    """Whether a device event is a range's span, not a kernel: a CUDA profile records each ``record_function``
    range that launched kernels (the layers', the optimiser's) once more on the device, a
    ``gpu_user_annotation`` from its first kernel's start to its last one's end, named as the range. The event's
    ``is_user_annotation`` says so; torch 2.4 lacks the flag, and there the span is told by its name among
    ``range_names`` (CPU events that launched no kernel themselves: a compiled graph's Triton kernel is launched
    inside a CPU event of its own name, and stays a kernel)."""
    flag = getattr(event, "is_user_annotation", None)
    return bool(flag) if flag is not None else event.name in range_names


def device_kernel_us(events):
    """All the profiled kernels' time, whichever CPU event launched them (the attribution's check); the ranges'
    spans on the device (:func:`range_span`) are not kernels: they cover the kernels inside them."""
    range_names = {event.name for event in events
                   if event.device_type == torch.autograd.DeviceType.CPU and not event.kernels}
    return sum(event.time_range.elapsed_us() for event in events
               if event.device_type == torch.autograd.DeviceType.CUDA and not range_span(event, range_names))


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_step(step, inputs, targets, layers, device, steps=3, warmup=2, layer_of_shapes=None):
    """Profile ``steps`` calls of ``step(inputs, targets)`` after ``warmup`` untimed ones, with a range around
    each of ``layers`` (``[(name, module)]``, in forward order), or for a compiled step, whose graph the
    ranges' hooks would break, the layers found by ``layer_of_shapes`` (:func:`convolution_shapes`); returns
    the table as a dict (times in ms per step)."""
    for _ in range(warmup):
        step(inputs, targets)
    synchronize(device)
    cuda = device.type == "cuda"
    ranges = LayerRanges(layers if layer_of_shapes is None else [])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with profile(activities=activities, record_shapes=layer_of_shapes is not None) as profiler:
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps):
                step(inputs, targets)
            synchronize(device)
            seconds = time.perf_counter() - start
    finally:
        ranges.remove()
    events = profiler.events()
    names = [name for name, _ in layers]
    rows = attribute(events, names, cuda, layer_of_shapes)
    step_us = 1e6 * seconds
    worked = sum(row["us"] for row in rows.values())
    table = {"device": "cuda" if cuda else "cpu", "steps": steps, "step_ms": step_us / steps / 1e3,
             "unit": "kernels" if cuda else "operators' own time",
             "attribution": "convolution shapes" if layer_of_shapes is not None else "ranges and sequence numbers",
             "rows": []}
    for name, row in rows.items():
        top = max(row["kernels"], key=row["kernels"].get) if row["kernels"] else ""
        kernels = sorted(row["kernels"].items(), key=lambda item: -item[1])[:5]
        table["rows"].append({"row": name, "ms": row["us"] / steps / 1e3, "share": row["us"] / step_us,
                              "around_ms": row["around_us"] / steps / 1e3, "main": top,
                              "kernels": {kernel: us / steps / 1e3 for kernel, us in kernels},
                              "architectures": sorted({architecture(k) for k in row["kernels"]} - {""})})
    idle = "device idle (no kernel running)" if cuda else "host between operators (Python, hooks)"
    table["rows"].append({"row": idle, "ms": (step_us - worked) / steps / 1e3, "share": (step_us - worked) / step_us,
                          "around_ms": 0.0, "main": "", "kernels": {}, "architectures": []})
    # The profile's own total, summed another way (every kernel; every operator's own time, by key), to
    # check that the rows lose nothing and count nothing twice.
    profiled = device_kernel_us(events) if cuda else sum(
        entry.self_cpu_time_total for entry in profiler.key_averages()
        if entry.key.startswith(("aten::", compiled_graph_range(events))))
    table["profiled_ms"], table["attributed_ms"] = profiled / steps / 1e3, worked / steps / 1e3
    warning = check_attribution(cuda, worked / steps / 1e3, profiled / steps / 1e3)
    if warning:
        table["warning"] = warning
    return table


def check_attribution(cuda, attributed_ms, profiled_ms):
    """What the table must say where its rows do not hold the profile's time (None where they do, within 1%): a
    GPU's profile without a kernel (:data:`NO_KERNELS`), or work in no row or in two."""
    if cuda and not profiled_ms:
        return NO_KERNELS
    if abs(attributed_ms - profiled_ms) <= 0.01 * profiled_ms:
        return None
    unit = "kernel time" if cuda else "operators' own time"
    how = "some of it is in no row" if attributed_ms < profiled_ms else "some of it is counted twice"
    return (f"The rows hold {attributed_ms:.2f} ms a step of the profile's {profiled_ms:.2f} ms of {unit}: {how}, and "
            "the rows are not the step's whole work.")


def markdown(table, title):
    cuda = table["device"] == "cuda"
    unit, main = ("kernel time", "main kernel") if cuda else ("operators' own CPU time", "main operator")
    if table.get("attribution") == "convolution shapes":
        held = ("A layer's row holds its convolution's work, forward and backward, found by its shapes; the "
                "compiled graph's fused kernels (the activations, the forms' reshuffles) are other element-wise.")
    else:
        held = ("A layer's row holds all its work, forward and backward: its convolution and, beside it, what "
                "is not the convolution's own (an exact form's pads, flips and reshuffles, casts, layout "
                "conversions).")
    lines = [f"{title}: {table['steps']} steps profiled, {table['step_ms']:.2f} ms a step (wall time, "
             f"synchronised, profiler on); each row's {unit} per step. {held}", "",
             f"| row | ms | share of the step | of which not the convolution (ms) | {main} |"
             + (" architectures |" if cuda else ""), "|---|---|---|---|---|" + ("---|" if cuda else "")]
    for row in table["rows"]:
        kernel = f"`{row['main'][:80]}`" if row["main"] else ""
        lines.append(f"| {row['row']} | {row['ms']:.2f} | {row['share']:.1%} | {row['around_ms']:.2f} | {kernel} |"
                     + (f" {', '.join(row['architectures'])} |" if cuda else ""))
    total = sum(row["ms"] for row in table["rows"])
    lines.append(f"| the step | {total:.2f} | {total / table['step_ms']:.1%} | | |" + (" |" if cuda else ""))
    lines += ["", f"In the profile: {table['profiled_ms']:.2f} ms a step of {unit}; in the rows: "
                  f"{table['attributed_ms']:.2f} ms." + (f" {table['warning']}" if table.get("warning") else "")]
    return "\n".join(lines) + "\n"


OPTIMISER_KERNEL = re.compile(r"adam|multi_tensor_apply", re.I)


def kernel_kind(name):
    """A kernel's row kind from its name alone: optimiser, layout conversions, convolutions or other element-wise."""
    if OPTIMISER_KERNEL.search(name):
        return "optimiser"
    if LAYOUT_KERNEL.search(name):
        return "layout conversions"
    return "convolutions" if CONV_KERNEL.search(name) else "other element-wise"


def trace_kernels(path):
    """``(kernels [(name, microseconds)], profiled steps)`` of a Chrome trace written by torch's profiler."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [(event["name"], event["dur"]) for event in events if event.get("cat") == "kernel"]
    steps = {event["name"] for event in events if event.get("name", "").startswith("ProfilerStep#")}
    return kernels, len(steps)


def trace_summary(path):
    """Markdown: the trace's kernel time by kind and, for the convolutions, by GPU architecture."""
    kernels, steps = trace_kernels(path)
    total = sum(us for _, us in kernels)
    if not kernels:
        return f"{path}: no GPU kernels in this trace (a CPU run's trace has none).\n"
    kinds, architectures = defaultdict(float), defaultdict(float)
    for name, us in kernels:
        kinds[kernel_kind(name)] += us
        if kernel_kind(name) == "convolutions":
            architectures[architecture(name) or "not named"] += us
    per_step = max(steps, 1)
    lines = [f"{path}: {len(kernels)} kernels, {total / 1e3:.2f} ms in {steps} profiled steps "
             f"({total / per_step / 1e3:.2f} ms a step), sorted by name.", "",
             "| kind | ms a step | share |", "|---|---|---|"]
    lines += [f"| {kind} | {us / per_step / 1e3:.2f} | {us / total:.1%} |"
              for kind, us in sorted(kinds.items(), key=lambda item: -item[1])]
    conv = kinds["convolutions"]
    lines += ["", "| convolution kernels written for | ms a step | share of the convolutions' |", "|---|---|---|"]
    lines += [f"| {arch} | {us / per_step / 1e3:.2f} | {us / conv:.1%} |"
              for arch, us in sorted(architectures.items(), key=lambda item: -item[1])]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description="A GPU trace's kernel time by kind (convolutions, layout "
                                     "conversions, other element-wise, optimiser) and the convolutions' by "
                                     "architecture, from the kernels' names.")
    parser.add_argument("traces", nargs="+", help="torch profiler traces (.pt.trace.json or .pt.trace.json.gz)")
    for path in parser.parse_args(argv).traces:
        print(trace_summary(path))


if __name__ == "__main__":
    main()
