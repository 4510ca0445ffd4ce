"""benchmarks/in_step.py: one real training step's time, attributed layer by layer from the profiler's events."""
import functools

import pytest
import torch

import train
from benchmarks import in_step, layers
from conftest import needs_cuda
from utils.compiler import compile_problem
from utils.YParams import load_params

# The demo model at its narrowest: a step of a few hundred milliseconds on a CPU.
TINY = ["--config=demo", "--device=cpu", "--base_channels=4", "--crop_size=32", "--global_batch_size=2"]


def profiled(*options, device="cpu", steps=2):
    params = load_params([*TINY, *options])
    model, step, inputs, targets = layers.training_step(params, torch.device(device), params.global_batch_size)
    return in_step.profile_step(step, inputs, targets, layers.convolutions(model), torch.device(device), steps)


@pytest.fixture(scope="module")
def tables():
    torch.manual_seed(0)
    return {forms: profiled(f"--exact_forms={forms}") for forms in ("off", "on")}


def test_every_layer_has_its_row_and_the_rows_add_up_to_the_step(tables):
    for table in tables.values():
        names = [row["row"] for row in table["rows"]]
        assert names == [name for name, _ in layers.convolutions(train.UNet(4, 5, 4, False))] + [
            "layout conversions", "other element-wise", "optimiser", "host between operators (Python, hooks)"]
        assert sum(row["ms"] for row in table["rows"]) == pytest.approx(table["step_ms"], rel=1e-9)
        # Nothing counted twice or lost: the rows hold what the profile holds, and fit in the step.
        assert table["attributed_ms"] == pytest.approx(table["profiled_ms"], rel=1e-6)
        assert 0 < table["attributed_ms"] <= table["step_ms"]
        rows = {row["row"]: row for row in table["rows"]}
        assert all(rows[name]["ms"] > 0 for name in ("down 1", "last", "other element-wise", "optimiser"))
        assert rows["optimiser"]["main"] != "" and rows["host between operators (Python, hooks)"]["ms"] >= 0


def test_backward_work_goes_to_its_layer_by_the_forward_operators_sequence_number(tables, monkeypatch):
    """Each layer's row holds its backward (autograd runs it under the forward operator's sequence number,
    outside any layer's range): a plain layer's work is its convolution's, forward and backward. (Its main
    operator is not compared: on a loaded machine one small operator, switched out, can take the longest.)"""
    rows = {row["row"]: row for row in tables["off"]["rows"]}
    for name in ("down 2", "up 1", "last"):
        assert "aten::convolution_backward" in rows[name]["kernels"], rows[name]
        assert rows[name]["around_ms"] < rows[name]["ms"] / 2, rows[name]
    # With the ranges alone (no sequence numbers) the backward would be left to "other element-wise".
    monkeypatch.setattr(in_step, "forward_sequences", lambda events: {})
    blind = profiled("--exact_forms=off")
    blind_rows = {row["row"]: row for row in blind["rows"]}
    assert "aten::convolution_backward" in blind_rows["other element-wise"]["kernels"]
    assert all("aten::convolution_backward" not in blind_rows[name]["kernels"] for name in ("down 2", "up 1", "last"))


def attributed(*options, layer_of_shapes=None):
    """{row: {"us", "around_us", "kernels": every operator's own time}} of one profiled step (after one
    untimed step), with the layer ranges unless the layers are found by ``layer_of_shapes``; the profile's
    own time per operator; its events."""
    params = load_params([*TINY, *options])
    model, step, inputs, targets = layers.training_step(params, torch.device("cpu"), params.global_batch_size)
    convolutions = layers.convolutions(model)
    step(inputs, targets)
    ranges = in_step.LayerRanges(convolutions if layer_of_shapes is None else [])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=layer_of_shapes is not None) as profiler:
        step(inputs, targets)
    ranges.remove()
    rows = in_step.attribute(profiler.events(), [name for name, _ in convolutions], False, layer_of_shapes)
    return rows, {entry.key: entry.self_cpu_time_total for entry in profiler.key_averages()}, profiler.events()


LAYER_ROWS = ("down", "up", "last")


def test_an_exact_forms_own_work_forward_and_backward_is_counted_in_its_layers_row():
    """The operators that only the exact forms run (their pads, flips, reshuffles, bias repeats, forward and
    backward) have all their time in the layers' rows, none in the layout or element-wise rows; the sub-pixel
    form's weight flip in its own layer's. The sums of two gradients of one tensor (the skip connections),
    which autograd runs beside a layer's backward node, are no layer's work."""
    torch.manual_seed(0)
    rows, profiled, events = attributed("--exact_forms=on")
    _, plain, _ = attributed("--exact_forms=off")
    forms_own = [key for key, us in profiled.items() if key.startswith("aten::") and key not in plain and us > 0]
    assert "aten::flip" in forms_own
    in_layers = {name: row for name, row in rows.items() if name.startswith(LAYER_ROWS)}
    for operator in forms_own:
        held = sum(row["kernels"].get(operator, 0.0) for row in in_layers.values())
        assert held == pytest.approx(profiled[operator], rel=1e-9), operator
    assert in_layers["last"]["kernels"]["aten::flip"] > 0
    # Their time is the row's work beside the convolution's: shown in the column, not in the layout row.
    for name in ("down 1", "up 1", "last"):
        assert 0 < in_layers[name]["around_us"] < in_layers[name]["us"]
    assert rows["layout conversions"]["us"] < min(in_layers[name]["around_us"] for name in ("down 1", "last"))
    gradient_sums = sum(event.self_cpu_time_total for event in events if event.name == "aten::add"
                        and event.cpu_parent is not None and event.cpu_parent.name.startswith(in_step.BACKWARD))
    assert gradient_sums > 0
    assert rows["other element-wise"]["kernels"]["aten::add"] >= gradient_sums - 1e-9


def test_convolution_shapes_find_each_layer_and_refuse_two_layers_alike():
    params = load_params([*TINY, "--exact_forms=on"])
    model, _, inputs, _ = layers.training_step(params, torch.device("cpu"), params.global_batch_size)
    shapes = in_step.convolution_shapes(model, inputs, layers.convolutions(model))
    assert sorted(set(shapes.values())) == sorted(name for name, _ in layers.convolutions(model))
    # The sub-pixel form's convolution: the input as it is, 8 times the output channels, kernel 2.
    assert shapes[((2, 8, 16, 16, 16), (40, 8, 2, 2, 2))] == "last"
    twins = torch.nn.Sequential(torch.nn.Conv3d(2, 2, 3, padding=1), torch.nn.Conv3d(2, 2, 3, padding=1))
    with pytest.raises(ValueError, match="same shapes"):
        in_step.convolution_shapes(twins, torch.zeros(1, 2, 4, 4, 4), list(zip(("a", "b"), twins)))


@pytest.mark.slow
@pytest.mark.skipif(compile_problem() is not None, reason=str(compile_problem()))
def test_a_compiled_step_keeps_its_layer_rows_found_by_their_convolutions_shapes():
    """Under --jit_mode=compile no hook runs inside the graph and the backward is one compiled node: each layer's
    convolution, forward and backward, is still found, by its shapes, and none is left to another row."""
    params = load_params([*TINY, "--exact_forms=on", "--jit_mode=compile"])
    model, _, inputs, _ = layers.training_step(params, torch.device("cpu"), params.global_batch_size)
    shapes = in_step.convolution_shapes(model, inputs, layers.convolutions(model))
    rows, profiled, events = attributed("--exact_forms=on", "--jit_mode=compile", layer_of_shapes=shapes)
    for name, row in rows.items():
        if name.startswith(LAYER_ROWS):
            assert row["kernels"]["aten::convolution_backward"] > 0, name
            assert row["kernels"]["aten::mkldnn_convolution"] + row["kernels"]["aten::_convolution"] > 0, name
        else:
            assert not any(in_step.CONV_OP.search(operator) for operator in row["kernels"]), (name, row["kernels"])
    assert rows["other element-wise"]["kernels"][in_step.FUSED] > 0  # the graph's own (fused) kernels
    assert sum(row["us"] for row in rows.values()) == pytest.approx(sum(
        us for key, us in profiled.items() if key.startswith(("aten::", in_step.compiled_graph_range(events)))), rel=1e-6)


def test_kernel_names_give_their_architecture():
    assert in_step.architecture("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") == "sm90"
    assert in_step.architecture("sm80_xmma_dgrad_implicit_gemm_indexed_bf16bf16") == "sm80"
    assert in_step.architecture("void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16>") == "sm80"
    assert in_step.architecture("ampere_sgemm_128x64_nn") == "sm80"
    assert in_step.architecture("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>") == ""
    assert in_step.architecture("convolveNd_dgrad_float_engine") == ""


def test_the_table_is_written_with_every_row_and_the_step(tables):
    text = in_step.markdown(tables["on"], "The step")
    for row in tables["on"]["rows"]:
        assert f"| {row['row']} | {row['ms']:.2f} |" in text
    assert f"| the step | {tables['on']['step_ms']:.2f} | 100.0% |" in text and "architectures" not in text


def cuda_profile_events():
    """The events torch's profiler gives for a layer's forward and the optimiser's step on a GPU, linked as its
    parser links them (torch/autograd/profiler.py): each kernel is a CUDA event, and a kernel of the CPU operator
    that launched it; each ``record_function`` range that launched kernels is also a CUDA event of its own
    name, its span on the device (kineto's ``gpu_user_annotation``, ``is_user_annotation``), linked to no
    operator. Returns ``(events, kernels' microseconds)``."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(name, start, end, parent=None, device=DeviceType.CPU, annotation=False):
        made = FunctionEvent(id=len(events), name=name, thread=1, start_us=start, end_us=end, device_type=device,
                             use_device="cuda")
        made.is_user_annotation = annotation
        if parent is not None:
            made.set_cpu_parent(parent)
            parent.append_cpu_child(made)
        events.append(made)
        return made

    def kernel(operator, name, start, end):
        operator.append_kernel(name, 0, end - start)
        event(name, start, end, device=DeviceType.CUDA)

    events = []
    layer = event(in_step.LAYER + "down 1", 0, 100, annotation=True)
    convolution = event("aten::cudnn_convolution", 20, 80, event("aten::convolution", 10, 90, layer))
    event("cudaLaunchKernel", 30, 35, convolution)
    kernel(convolution, "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 40, 140)
    cast = event("aten::copy_", 82, 88, event("aten::_to_copy", 81, 89, layer))
    kernel(cast, "void at::native::unrolled_elementwise_kernel<copy>", 145, 150)
    step = event(in_step.OPTIMISER[0] + "Adam.step", 200, 300, annotation=True)
    kernel(event("aten::_fused_adam_", 210, 290, step), "void multi_tensor_apply_kernel<FusedAdam>", 300, 330)
    event(layer.name, 40, 150, device=DeviceType.CUDA, annotation=True)  # the ranges' spans on the device
    event(step.name, 300, 330, device=DeviceType.CUDA, annotation=True)
    return events, 100 + 5 + 30


def test_on_a_gpu_the_ranges_spans_are_not_counted_as_kernels():
    """A CUDA profile holds each range's span on the device beside its kernels: the check of the table (every
    kernel in the rows, none twice) counts the kernels alone, so it agrees with the rows; torch 2.4's events,
    which lack the ``is_user_annotation`` flag, are told by their range's name."""
    events, kernels_us = cuda_profile_events()
    rows = in_step.attribute(events, ["down 1"], True)
    assert rows["down 1"]["us"] == 105 and rows["down 1"]["around_us"] == 5 and rows["optimiser"]["us"] == 30
    assert sum(row["us"] for row in rows.values()) == kernels_us
    assert in_step.device_kernel_us(events) == kernels_us
    for each in events:
        del each.is_user_annotation
    assert in_step.device_kernel_us(events) == kernels_us
    assert in_step.check_attribution(True, kernels_us / 1e3, in_step.device_kernel_us(events) / 1e3) is None


def test_on_a_gpu_a_compiled_graphs_kernels_named_as_their_launch_are_kernels():
    """Inductor launches each Triton kernel inside a CPU event of the kernel's own name: that kernel is no range's
    span and counts, with the flag (torch >= 2.5) and without it (2.4, where the spans are told by name)."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    events, kernels_us = cuda_profile_events()
    layer = next(each for each in events if each.name == in_step.LAYER + "down 1")
    name = "triton_poi_fused__to_copy_convolution_0"
    launch = FunctionEvent(id=len(events), name=name, thread=1, start_us=90, end_us=95, use_device="cuda")
    launch.set_cpu_parent(layer)
    layer.append_cpu_child(launch)
    launch.append_kernel(name, 0, 20)
    events += [launch, FunctionEvent(id=len(events) + 1, name=name, thread=1, start_us=150, end_us=170,
                                     device_type=DeviceType.CUDA, use_device="cuda")]
    assert in_step.device_kernel_us(events) == kernels_us + 20
    for each in events:
        vars(each).pop("is_user_annotation", None)  # as torch 2.4 makes them
    assert in_step.device_kernel_us(events) == kernels_us + 20


def test_kernels_that_no_row_holds_are_said():
    """A kernel linked to no operator of the profile is in no row: the table says its rows fall short of the
    profile's kernel time (and where a row counted work twice, that it exceeds it), instead of showing fewer
    milliseconds as the step's work."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    events, kernels_us = cuda_profile_events()
    events.append(FunctionEvent(id=len(events), name="void at::native::elementwise_kernel<add>", thread=1, start_us=400,
                                end_us=440, device_type=DeviceType.CUDA, use_device="cuda"))
    rows = in_step.attribute(events, ["down 1"], True)
    attributed, profiled = sum(row["us"] for row in rows.values()) / 1e3, in_step.device_kernel_us(events) / 1e3
    assert (attributed, profiled) == (kernels_us / 1e3, (kernels_us + 40) / 1e3)
    assert "some of it is in no row" in in_step.check_attribution(True, attributed, profiled)
    assert "counted twice" in in_step.check_attribution(False, profiled, attributed)
    assert in_step.check_attribution(False, 100.0, 100.5) is None


def test_a_gpu_profile_without_kernels_says_its_rows_are_not_measured(monkeypatch):
    """Where the profiler cannot trace the device (CUPTI), a GPU's profile holds the CPU operators and no kernel:
    the table then says that its rows measure nothing, beside the step's wall time. Here the profiler is asked
    for CUDA activity on a CPU build, which records no kernel either (the step runs on the CPU)."""
    monkeypatch.setattr(in_step, "synchronize", lambda device: None)
    params = load_params(TINY)
    model, step, inputs, targets = layers.training_step(params, torch.device("cpu"), params.global_batch_size)
    table = in_step.profile_step(step, inputs, targets, layers.convolutions(model), torch.device("cuda"), 1, warmup=1)
    assert table["device"] == "cuda" and table["profiled_ms"] == 0 and table["warning"] == in_step.NO_KERNELS
    assert in_step.NO_KERNELS in in_step.markdown(table, "The step")
    assert "warning" not in profiled()  # a CPU's table has its operators


@needs_cuda()
def test_on_a_gpu_every_kernel_is_attributed_and_the_convolutions_name_their_kernels():
    table = profiled("--device=cuda", "--amp_mode=bf16", "--channels_last", device="cuda", steps=3)
    assert table["attributed_ms"] == pytest.approx(table["profiled_ms"], rel=1e-3) and "warning" not in table
    rows = {row["row"]: row for row in table["rows"]}
    assert all(rows[name]["ms"] > 0 and rows[name]["main"] for name in ("down 1", "up 1", "last"))
    assert rows["device idle (no kernel running)"]["ms"] >= 0


def test_the_committed_traces_kernel_kinds_are_those_docs_09_quotes():
    """docs/09's table of the bf16 + fused + JIT rung's kernels, from its committed H100 trace: each kind's ms and
    share, and the convolutions' ms in Ampere kernels, are the numbers the trace gives."""
    import os
    import re

    import quotes
    from conftest import ROOT
    path = "sample_nsys_profiles/gpu_inmem_bf16_fused_jit.pt.trace.json.gz"
    summary = in_step.trace_summary(os.path.join(ROOT, path))
    text = quotes.section("docs/09-going-further.md", "Inside the real step")
    assert f"python -m benchmarks.in_step {path}" in text
    kinds = re.findall(r"^\| (convolutions|other element-wise|layout conversions|optimiser)"
                       r" \| ([\d.]+) \| ([\d.]+)% \|$", summary, flags=re.M)
    assert [kind for kind, _, _ in kinds] == ["convolutions", "other element-wise", "layout conversions", "optimiser"]
    quotes.assert_quoted(text, *(number for _, ms, share in kinds for number in (ms, share)))
    sm80 = re.search(r"^\| sm80 \| ([\d.]+) \| ([\d.]+)% \|$", summary, flags=re.M)
    quotes.assert_quoted(text, sm80.group(1), sm80.group(2))


@functools.lru_cache(maxsize=None)
def committed_trace(name):
    """``(kernels, steps)`` of a committed GPU trace (sample_nsys_profiles/), for the numbers docs 03 and 09 read
    off it. Each kernel is ``(name, microseconds, stream, call, around)``: ``call`` is the outermost convolution
    operator around the CUDA launch that queued it (the profiler's correlation id), as ``(operator, first input's
    shape, second input's shape)``, or None; ``around`` holds the names of every CPU event around that launch."""
    import gzip
    import json
    import os

    from conftest import ROOT
    path = os.path.join(ROOT, "sample_nsys_profiles", name)
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    # One sweep over each thread's events in time order: the CPU events open at a launch are the ones around it.
    timeline, around_launch, stack = [], {}, []
    for event in events:
        if event.get("cat") in ("cpu_op", "user_annotation"):
            timeline.append((event["tid"], event["ts"], 0, -event["dur"], id(event), event))
        elif event.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in event.get("args", {}):
            timeline.append((event["tid"], event["ts"], 1, 0, id(event), event))
    thread = None
    for tid, ts, is_launch, _, _, event in sorted(timeline):
        if tid != thread:
            thread, stack = tid, []
        while stack and stack[-1]["ts"] + stack[-1]["dur"] < ts:
            stack.pop()
        if is_launch:
            around_launch[event["args"]["correlation"]] = list(stack)
        else:
            stack.append(event)
    kernels = []
    for event in (event for event in events if event.get("cat") == "kernel"):
        around = around_launch.get(event["args"].get("correlation"), [])
        convolutions = [e for e in around if e["name"] in ("aten::conv3d", "aten::conv_transpose3d",
                                                           "aten::convolution_backward")]
        call = (convolutions[0]["name"], *(tuple(dims) for dims in convolutions[0]["args"]["Input Dims"][:2])) \
            if convolutions else None
        kernels.append((event["name"], event["dur"], event["args"]["stream"], call, [e["name"] for e in around]))
    _, steps = in_step.trace_kernels(path)
    return kernels, steps


# The calls of the first and last layers and of `up 1`, forward and backward, at batch 64 and 64^3 crops.
FIRST = [("aten::conv3d", (64, 4, 64, 64, 64), (64, 4, 4, 4, 4)),
         ("aten::convolution_backward", (64, 64, 32, 32, 32), (64, 4, 64, 64, 64))]
LAST = [("aten::conv_transpose3d", (64, 128, 32, 32, 32), (128, 5, 4, 4, 4)),
        ("aten::convolution_backward", (64, 5, 64, 64, 64), (64, 128, 32, 32, 32))]
UP_1 = ("aten::conv_transpose3d", (64, 256, 16, 16, 16), (256, 64, 4, 4, 4))


def test_docs_quote_the_committed_traces_convolution_calls():
    """docs/09's reading of the bf16 + fused Adam + JIT rung's H100 trace call by call: the first and last layers'
    share of the kernel time (and docs/03's), the calls' share, the last layer's layout conversions; `up 1`'s and
    the last layer's forwards in one kernel, their rates, the tile's use, and the roofline reading of the first and
    last layers, each recomputed from the trace and the FLOP table."""
    import re

    import quotes
    kernels, steps = committed_trace("gpu_inmem_bf16_fused_jit.pt.trace.json.gz")

    def ms(chosen):  # ms a step
        return sum(kernel[1] for kernel in chosen) / steps / 1e3

    total = ms(kernels)
    by_call = {}
    for kernel in kernels:
        by_call.setdefault(kernel[3], []).append(kernel)
    first, last = (ms([k for call in calls for k in by_call[call]]) for calls in (FIRST, LAST))
    conversions = ms([k for call in LAST for k in by_call[call] if in_step.kernel_kind(k[0]) == "layout conversions"])
    share = 100 * (first + last) / total
    calls_share = 100 * (1 - ms(by_call[None]) / total)
    inside = quotes.section("docs/09-going-further.md", "Inside the real step")
    quotes.assert_quoted(inside, f"{calls_share:.1f}", f"{first:.2f}", f"{last:.2f}", f"{conversions:.2f}",
                         f"{share:.1f}", f"{total:.2f}")
    quotes.assert_quoted(quotes.section("docs/09-going-further.md", "Where the time goes"), f"{share:.1f}")
    quotes.assert_quoted(quotes.section("docs/03-profiling-and-optimisation.md", "The optimisation ladder"),
                         f"{share:.1f}")
    assert all(in_step.kernel_kind(k[0]) != "layout conversions" for k in by_call[None])  # all inside the calls

    def forward(call):  # the kernel that takes most of the call's time: its convolution
        names = {}
        for kernel in by_call[call]:
            names[kernel[0]] = names.get(kernel[0], 0) + kernel[1]
        name = max(names, key=names.get)
        return name, names[name] / steps / 1e3

    (up_1, up_1_ms), (last_name, last_ms), (first_name, first_ms) = forward(UP_1), forward(LAST[0]), forward(FIRST[0])
    assert up_1 == last_name and "dgrad" in up_1 and "strided" in up_1  # one kernel for both
    flops = {"up 1": 2 * 64 * 16 ** 3 * 256 * 64 * 4 ** 3, "last": 2 * 64 * 32 ** 3 * 128 * 5 * 4 ** 3,
             "first": 2 * 64 * 32 ** 3 * 4 * 64 * 4 ** 3}  # multiply-adds of each forward, 2 FLOPs each
    rate = {"up 1": flops["up 1"] / up_1_ms / 1e9, "last": flops["last"] / last_ms / 1e9,
            "first": flops["first"] / first_ms / 1e9}  # TFLOP/s
    tile_n = int(re.search(r"tilesize(\d+)x(\d+)x(\d+)", up_1).group(2))
    # Forward FLOPs per byte, from docs/09's FLOP table (tests/test_layers.py checks it is the tool's).
    table = quotes.read("docs/09-going-further.md")
    intensity = {row: int(re.search(rf"^\| {name} \| [^|]* \| [^|]* \| [^|]* \| [^|]* \| (\d+) \|$", table,
                                    flags=re.M).group(1)) for row, name in (("first", "down 1"), ("last", "last"))}
    bandwidth = {row: rate[row] / intensity[row] for row in ("first", "last")}  # TB/s at the least traffic
    forms = quotes.section("docs/09-going-further.md", "Exact faster forms of the slow layers")
    quotes.assert_quoted(forms, f"{flops['up 1'] / 1e9:.1f}", f"{up_1_ms:.2f}", f"{rate['up 1']:.0f}",
                         f"{flops['last'] / 1e9:.1f}", f"{last_ms:.2f}", f"{rate['last']:.1f}",
                         f"{100 * 5 / tile_n:.1f}", f"{100 * 8 / tile_n:.1f}", 8 * 5,
                         f"{flops['last'] * tile_n / 5 / rate['up 1'] / 1e9:.1f}",
                         intensity["last"], f"{bandwidth['last']:.2f}", intensity["first"], f"{rate['first']:.0f}",
                         f"{bandwidth['first']:.2f}", f"{100 * bandwidth['first'] / 3.35:.0f}")
    assert 100 * bandwidth["last"] / 3.35 < 4  # "under 4% of the H100's 3.35 TB/s"


def test_docs_quote_the_committed_traces_optimiser_loss_gaps_and_dali_kernels():
    """docs/03's optimiser kernels foreach and fused (and the step time fused Adam saved, in the same section), the loss's
    few kernels, the baseline's idle gaps between pairs of steps and its busy share; docs/09's DALI kernels beside
    the training's, each from its committed trace."""
    import json
    import os

    import quotes
    from conftest import ROOT

    def optimiser_ms(name):
        kernels, steps = committed_trace(name)
        return sum(k[1] for k in kernels if any(e.startswith("Optimizer.step#") for e in k[4])) / steps / 1e3

    foreach, fused = optimiser_ms("gpu_inmem_bf16.pt.trace.json.gz"), optimiser_ms(
        "gpu_inmem_bf16_fused_jit.pt.trace.json.gz")
    chapter = "docs/03-profiling-and-optimisation.md"
    quotes.assert_quoted(quotes.section(chapter, "Fused Adam, JIT"), f"{fused:.1f}", f"{foreach:.1f}")
    with open(os.path.join(ROOT, "benchmarks", "results", "nvidia-h100-80gb-hbm3-2026-11-25.json")) as f:
        full = {run["name"]: run["full"] for run in json.load(f)["runs"]}
    saved = 1e3 * (64 / full["gpu-inmem + AMP bf16"] - 64 / full["+ fused Adam (bf16)"])
    assert f"{saved:.1f}" == f"{foreach - fused:.1f}"  # the step shortened by what the kernels save
    quotes.assert_quoted(quotes.section(chapter, "Fused Adam, JIT"), f"{saved:.1f}")

    kernels, steps = committed_trace("gpu_inmem_bf16.pt.trace.json.gz")
    loss = [k for k in kernels if "aten::l1_loss" in k[4] and not any("Backward" in e for e in k[4])]
    assert len(loss) == 4 * steps and round(sum(k[1] for k in loss) / steps / 1e3) == 1  # "four kernels, about 1 ms"

    import gzip
    with gzip.open(os.path.join(ROOT, "sample_nsys_profiles", "baseline.pt.trace.json.gz"), "rt") as f:
        baseline = sorted((e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    end, gaps = baseline[0]["ts"], []
    for kernel in baseline:
        if kernel["ts"] - end > 1e5:  # the GPU idle over 100 ms
            gaps.append(kernel["ts"] - end)
        end = max(end, kernel["ts"] + kernel["dur"])
    busy = sum(k["dur"] for k in baseline) / (end - baseline[0]["ts"])
    assert len(gaps) == 2  # 4 steps: two pairs, run back to back
    quotes.assert_quoted(quotes.section(chapter, "Profiling with Nsight"), f"{min(gaps) / 1e6:.2f}",
                         f"{max(gaps) / 1e6:.2f}", f"{100 * busy:.0f}")

    kernels, steps = committed_trace("dali/dali_bf16_fused.pt.trace.json.gz")
    streams = {}
    for kernel in kernels:
        streams[kernel[2]] = streams.get(kernel[2], 0) + kernel[1]
    training = max(streams, key=streams.get)
    dali = [k for k in kernels if k[2] != training]
    assert all(k[0].startswith("void dali::") for k in dali)
    dali_us = sum(k[1] for k in dali)
    quotes.assert_quoted(quotes.section("docs/09-going-further.md", "The ladder on an H200"),
                         f"{dali_us / steps / 1e3:.2f}", f"{100 * dali_us / sum(streams.values()):.1f}")


def test_kernels_are_sorted_by_their_names():
    assert in_step.kernel_kind("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>") == \
        "layout conversions"
    assert in_step.kernel_kind("sm90_xmma_dgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") == \
        "convolutions"
    assert in_step.kernel_kind("cudnn_generated_fort_native_sm80_convFwd_knob_21_128x128x32_4_0") == "convolutions"
    assert in_step.kernel_kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>") == "optimiser"
    assert in_step.kernel_kind("void at::native::vectorized_elementwise_kernel<8, leaky_relu>") == \
        "other element-wise"


def test_docs_09_quotes_the_committed_cpu_runs_of_the_step_layer_by_layer():
    """docs/09's side-by-side table of the step layer by layer (off, auto, on, the first and last layers alone) is
    the committed idle CPU run's, row for row; the numbers its paragraphs give are those of the runs they name:
    the spread of the plain steps, every form on, the list alone, the rows that gain and lose, crop 32, and the
    layers timed alone."""
    import json
    import os
    import re

    import quotes
    from conftest import ROOT

    def report(suffix):
        with open(os.path.join(ROOT, "benchmarks", "results", "layers",
                               f"cpu-vm-2-cores-2026-11-27-fp32{suffix}.json")) as f:
            return json.load(f)

    listed = "[down.0.0,last]"
    name = "cpu-vm-2-cores-2026-11-27-fp32-6"
    crop64 = {suffix: report(suffix) for suffix in ("-5", "-6", "-7")}
    tables = crop64["-6"]["in_step"]
    off, auto, on, alone = (tables[forms] for forms in ("off", "auto", "on", listed))
    docs = quotes.read("docs/09-going-further.md")
    table = docs[docs.index(f"<!-- in-step: {name}.json -->"):].split("\n\n", 1)[0]
    expected = [f"| {a['row']} | {b['ms']:.2f} | {c['ms']:.2f} | {d['ms']:.2f} | {d['around_ms']:.2f} | {e['ms']:.2f} |"
                for a, b, c, d, e in zip(off["rows"], off["rows"], auto["rows"], on["rows"], alone["rows"])]
    assert re.findall(r"^\|.*\|$", table, flags=re.M)[2:] == expected + [
        f"| the step | {off['step_ms']:.2f} | {auto['step_ms']:.2f} | {on['step_ms']:.2f} | | {alone['step_ms']:.2f} |"]
    section = quotes.section("docs/09-going-further.md", "Inside the real step")
    assert f"`{crop64['-6']['command']}`" in " ".join(section.split())
    text = "\n".join(line for line in section.splitlines() if not line.startswith("|"))  # the words, not the table
    assert all(run["crop"] == 64 and run["in_step"]["off"]["steps"] == 10 for run in crop64.values())

    plain = [run["in_step"][forms]["step_ms"] for run in crop64.values() for forms in ("off", "auto")]
    every = [run["in_step"]["on"]["step_ms"] for run in crop64.values()]
    listed_ms = [crop64[suffix]["in_step"][listed]["step_ms"] for suffix in ("-6", "-7")]
    assert max(listed_ms) < min(plain + every)  # the claim: the fastest step measured at crop 64
    quotes.assert_quoted(text, *(f"{ms:.2f}" for ms in [min(plain), max(plain), *every, *listed_ms]))
    rows = {(forms, row["row"]): row for forms, table in tables.items() for row in table["rows"]}
    quotes.assert_quoted(text, *(f"{rows[forms, layer]['ms']:.2f}" for forms, layer in (
        ("off", "last"), ("on", "last"), (listed, "last"), ("off", "down 1"), ("auto", "down 1"), ("on", "down 1"),
        (listed, "down 1"), ("off", "up 4"), ("on", "up 4"), ("off", "up 3"), ("on", "up 3"))),
        f"{rows['on', 'up 4']['around_ms']:.2f}")
    assert rows["on", "up 4"]["main"] == "aten::copy_"

    three = report("-3")["in_step"]
    crop32 = report("-4")["in_step"]
    assert report("-4")["crop"] == 32
    quotes.assert_quoted(text, *(f"{three[forms]['step_ms']:.2f}" for forms in ("off", "auto", "on")),
                         *(f"{crop32[forms]['step_ms']:.2f}" for forms in ("off", "auto", "on")))
    rows32 = {(forms, row["row"]): row["ms"] for forms, table in crop32.items() for row in table["rows"]}
    quotes.assert_quoted(text, *(f"{rows32[forms, layer]:.2f}" for forms in ("off", "on")
                                 for layer in ("up 4", "up 3", "last")))

    forms = quotes.section("docs/09-going-further.md", "Exact faster forms of the slow layers")
    for suffix, layers in (("-5", ("down 1", "last", "up 4", "up 3")), ("-4", ("down 1", "last"))):
        ratios = {layer["layer"]: layer for layer in report(suffix)["layers"]}
        quotes.assert_quoted(forms, *(f"{ratios[layer]['ms'] / ratios[layer]['exact_form_ms']:.2f}"
                                      for layer in layers))
