"""benchmarks/in_step.py: one real training step's time, attributed layer by layer from the profiler's events."""
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


@pytest.mark.skipif(compile_problem() is not None, reason=str(compile_problem()))
def test_a_compiled_step_keeps_its_layer_rows_found_by_their_convolutions_shapes():
    """Under --jit_mode=compile no hook runs inside the graph and the backward is one compiled node: each layer's
    convolution, forward and backward, is still found, by its shapes, and none is left to another row."""
    params = load_params([*TINY, "--exact_forms=on", "--jit_mode=compile"])
    model, _, inputs, _ = layers.training_step(params, torch.device("cpu"), params.global_batch_size)
    shapes = in_step.convolution_shapes(model, inputs, layers.convolutions(model))
    rows, profiled, _ = attributed("--exact_forms=on", "--jit_mode=compile", layer_of_shapes=shapes)
    for name, row in rows.items():
        if name.startswith(LAYER_ROWS):
            assert row["kernels"]["aten::convolution_backward"] > 0, name
            assert row["kernels"]["aten::mkldnn_convolution"] + row["kernels"]["aten::_convolution"] > 0, name
        else:
            assert not any(in_step.CONV_OP.search(operator) for operator in row["kernels"]), (name, row["kernels"])
    assert rows["other element-wise"]["kernels"][in_step.FUSED] > 0  # the graph's own (fused) kernels
    assert sum(row["us"] for row in rows.values()) == pytest.approx(sum(
        us for key, us in profiled.items() if key.startswith(("aten::", in_step.COMPILED_GRAPH))), rel=1e-6)


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


@needs_cuda()
def test_on_a_gpu_every_kernel_is_attributed_and_the_convolutions_name_their_kernels():
    table = profiled("--device=cuda", "--amp_mode=bf16", "--channels_last", device="cuda", steps=3)
    assert table["attributed_ms"] == pytest.approx(table["profiled_ms"], rel=1e-3)
    rows = {row["row"]: row for row in table["rows"]}
    assert all(rows[name]["ms"] > 0 and rows[name]["main"] for name in ("down 1", "up 1", "last"))
    assert rows["device idle (no kernel running)"]["ms"] >= 0


def test_the_committed_traces_kernel_kinds_are_those_docs_03_quotes():
    """docs/09's table of the bf16 + fused + JIT rung's kernels, from its committed H100 trace."""
    import os
    import re

    from conftest import ROOT
    path = "sample_nsys_profiles/gpu_inmem_bf16_fused_jit.pt.trace.json.gz"
    summary = in_step.trace_summary(os.path.join(ROOT, path))
    docs = open(os.path.join(ROOT, "docs", "09-going-further.md")).read()
    assert f"python -m benchmarks.in_step {path}" in docs
    rows = re.findall(r"^\| (convolutions|other element-wise|layout conversions|optimiser) \| [\d.]+ \| [\d.]+% \|$",
                      summary, flags=re.M)
    assert rows == ["convolutions", "other element-wise", "layout conversions", "optimiser"]
    for line in summary.splitlines():
        if line.startswith(("| convolutions |", "| other element-wise |", "| layout conversions |", "| optimiser |")):
            assert line in docs, line
    sm80 = re.search(r"^\| sm80 \| ([\d.]+) \| ([\d.]+%) \|$", summary, flags=re.M)
    conv = re.search(r"^\| convolutions \| ([\d.]+) \|", summary, flags=re.M).group(1)
    assert f"Of the convolutions' {conv} ms, {sm80.group(1)} ({sm80.group(2)}) run in kernels written for Ampere" in \
        " ".join(docs.split())


def test_kernels_are_sorted_by_their_names():
    assert in_step.kernel_kind("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>") == \
        "layout conversions"
    assert in_step.kernel_kind("sm90_xmma_dgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") == \
        "convolutions"
    assert in_step.kernel_kind("cudnn_generated_fort_native_sm80_convFwd_knob_21_128x128x32_4_0") == "convolutions"
    assert in_step.kernel_kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>") == "optimiser"
    assert in_step.kernel_kind("void at::native::vectorized_elementwise_kernel<8, leaky_relu>") == \
        "other element-wise"


def test_docs_03_quotes_the_committed_cpu_run_of_the_step_layer_by_layer():
    """The side-by-side table of docs/09 (plain, in the exact forms) is the committed CPU run's, row for row,
    and so are the numbers its paragraph gives."""
    import json
    import os
    import re

    from conftest import ROOT
    name = "cpu-vm-2-cores-2026-11-26-fp32-4"
    with open(os.path.join(ROOT, "benchmarks", "results", "layers", name + ".json")) as f:
        report = json.load(f)
    off, on = report["in_step"]["off"], report["in_step"]["on"]
    docs = open(os.path.join(ROOT, "docs", "09-going-further.md")).read()
    table = docs[docs.index(f"<!-- in-step: {name}.json -->"):].split("\n\n", 1)[0]
    expected = [f"| {a['row']} | {a['ms']:.2f} | {b['ms']:.2f} | {b['layout_ms']:.2f} |"
                for a, b in zip(off["rows"], on["rows"])]
    assert re.findall(r"^\|.*\|$", table, flags=re.M)[2:] == expected + [
        f"| the step | {off['step_ms']:.2f} | {on['step_ms']:.2f} | |"]
    assert report["command"] == "python -m benchmarks.layers --preset cpu --committed --in_step_steps 10"
    assert f"`{report['command']}`" in " ".join(docs.split())
    text = " ".join(docs.split())
    rows = {(forms, row["row"]): row["ms"] for forms, table in (("off", off), ("on", on)) for row in table["rows"]}
    assert (f"The last layer does gain, {rows['off', 'last']:.2f} to {rows['on', 'last']:.2f} ms, and the first, "
            f"{rows['off', 'down 1']:.2f} to {rows['on', 'down 1']:.2f}") in text
    assert (f"are layout conversions, {rows['on', 'layout conversions']:.2f} ms a step against "
            f"{rows['off', 'layout conversions']:.2f}") in text
    assert f"takes {on['step_ms']:.2f} ms against {off['step_ms']:.2f}" in text
