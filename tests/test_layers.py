"""benchmarks/layers.py: the per-layer table on the CPU preset, and the FLOPs that add up to the model's."""
import json

import pytest
import torch

from benchmarks import layers
from conftest import ROOT
from readme_commands import tutorial_text
from utils.flops import unet_flops_per_sample
from utils.YParams import YParams


def test_full_scale_layers_add_up_to_80_5_gflop_per_sample():
    params = YParams("config/UNet.yaml", "base")  # full scale, width 64, crop 64
    rows = layers.layer_flops(params, batch=1)
    names = [f"down {i}" for i in range(1, 7)] + [f"up {i}" for i in range(5, 0, -1)] + ["last"]
    assert [name for name, *_ in rows] == names
    assert [shape[-1] for _, _, shape, _ in rows] == [64, 32, 16, 8, 4, 2, 1, 2, 4, 8, 16, 32]
    total = sum(flops for *_, flops in rows)
    assert total == pytest.approx(unet_flops_per_sample(params), rel=1e-9)
    assert total == pytest.approx(80.5e9, rel=0.01)


@pytest.mark.slow
def test_cpu_preset_writes_the_table_and_refuses_to_overwrite_it(tmp_path, capsys):
    layers.main(["--preset", "cpu", "--out_dir", str(tmp_path), "--repeats", "1"])
    [path] = tmp_path.glob("*-fp32.json")
    report = json.loads(path.read_text())
    assert len(report["layers"]) == 10 and report["batch"] == 8 and report["crop"] == 32
    assert sum(row["gflop"] for row in report["layers"]) == pytest.approx(report["total"]["model_gflop"])
    # A share is the layer's time alone over the step's (above 1 where a busy spell slowed the layer's single call).
    assert all(row["ms"] > 0 and row["tflops"] > 0 and row["share_of_step"] == pytest.approx(
        row["ms"] / report["total"]["step_ms"]) for row in report["layers"])
    # The first layer and every transposed one are timed in their exact forms as well (utils/exact_forms.py).
    forms = {row["layer"]: row["exact_form"] for row in report["layers"]}
    assert forms == {"down 1": "space-to-depth", "down 2": None, "down 3": None, "down 4": None, "down 5": None,
                     "up 4": "sub-pixel", "up 3": "sub-pixel", "up 2": "sub-pixel", "up 1": "sub-pixel",
                     "last": "sub-pixel"}
    assert all((row["exact_form_ms"] or 0) > 0 for row in report["layers"] if row["exact_form"])
    assert report["exact_forms"] == "[]" and report["rounds"] == 1 and report["cpu_model"]  # auto's choice on a CPU: plain
    load = report["load_average"]  # a machine shared with other work says so beside its times
    assert load["start"] >= 0 and load["end"] >= 0 and load["cpus"] >= 1
    assert f"load average on its {load['cpus']} cores: {load['start']:.2f} when the measurement began, " \
           f"{load['end']:.2f}" in path.with_suffix(".md").read_text()
    assert report["command"] == "python -m benchmarks.layers --preset cpu --out_dir " + str(tmp_path) + " --repeats 1"
    # The step layer by layer (benchmarks/in_step.py): the layers plain, as auto picks them, in their exact forms.
    assert list(report["in_step"]) == ["off", "auto", "on"] and report["in_step_pending"] == []
    for forms, table in report["in_step"].items():
        rows = {row["row"]: row["ms"] for row in table["rows"]}
        assert list(rows)[:10] == [row["layer"] for row in report["layers"]]
        assert sum(rows.values()) == pytest.approx(table["step_ms"])
        assert table["exact_forms"] == forms and table["jit_mode"] == "none" and table["load_average"] >= 0
        assert f"load average as the table was done: {table['load_average']:.2f}." in path.with_suffix(".md").read_text()
        assert f"--exact_forms={forms}, --jit_mode=none: the layers " in path.with_suffix(".md").read_text()
        # auto: each layer plain or in its own exact form, as the device decides.
        assert all(table["forms"][row["layer"]] in ({"off": "plain", "on": row["exact_form"] or "plain"}.get(forms) or
                                                    {"plain", row["exact_form"] or "plain"}) for row in report["layers"])
    output = capsys.readouterr().out
    assert "| last | ConvTranspose3d | 32 -> 5 | 16 |" in output and "The layers' FLOPs add up" in output
    last = next(line for line in output.splitlines() if line.startswith("| last |"))
    assert last.count("|") == 12 and "| sub-pixel |" in last
    assert path.with_suffix(".md").read_text() in output
    with pytest.raises(SystemExit):  # exit_on_user_error: the results of the first run are kept
        layers.main(["--preset", "cpu", "--out_dir", str(tmp_path), "--repeats", "1"])
    assert "already holds" in " ".join(capsys.readouterr().err.split())  # the message is wrapped at 100 columns


def test_flop_table_shares_and_intensity(capsys):
    """The README's FLOP table: the transposed convolutions carry 68% of the FLOPs, `up 1` a third, the
    deepest layers (1^3 to 4^3 inputs) 3.3%; printed without a GPU by `--flops`."""
    params = YParams("config/UNet.yaml", "base")
    rows = layers.layer_flops(params, batch=1)
    total = sum(flops for *_, flops in rows)
    share = {name: flops / total for name, _, _, flops in rows}
    assert round(share["up 1"], 3) == 0.320 and round(share["last"], 3) == 0.100
    assert round(sum(share[name] for name in ("down 5", "down 6", "up 5", "up 4")), 3) == 0.033
    layers.main(["--flops", "--amp_mode=bf16"])
    output = capsys.readouterr().out
    assert "Transposed convolutions: 68.2% of the FLOPs; all convolutions: 80.46 GFLOP per sample." in output
    assert "| down 1 | 4 -> 64 | 64 -> 32 | 2.15 | 2.7% | 171 |" in output
    readme = tutorial_text(ROOT)  # README.md and its chapters in docs/
    assert all(line in readme for line in output.splitlines() if line.startswith("| "))


def test_rounds_keep_each_function_s_least_mean(monkeypatch):
    """--rounds: the functions timed in turn, each round a mean; the least mean of each is kept."""
    import torch

    durations = {"slow": iter([0.03] * 5 + [0.01] * 5), "fast": iter([0.002] * 10)}
    clock = [0.0]

    def call(name):
        def function():
            clock[0] += next(durations[name])
        return function

    monkeypatch.setattr(layers.time, "perf_counter", lambda: clock[0])
    slow, fast = layers.time_rounds([call("slow"), call("fast")], torch.device("cpu"), repeats=3, rounds=2)
    # Round 1: 2 untimed + 3 timed calls of each (slow: 0.03 each); round 2: slow's mean of 0.01 is kept.
    assert slow == pytest.approx(0.01) and fast == pytest.approx(0.002)


SMALL = ["--preset", "cpu", "--base_channels=4", "--global_batch_size=2", "--repeats", "1"]


def test_a_run_cut_off_keeps_the_parts_it_finished(tmp_path, monkeypatch):
    """The layer table is on disk as soon as it is measured, and each table of the step as soon as it is
    profiled: an interruption during the second table keeps the layer table and the first, and says which are
    missing; each file is whole (written beside and renamed: no temporary file left), in a folder it made."""
    measured, tmp_path = layers.in_step_table, tmp_path / "new"

    def cut_off_at_auto(options, device, steps, forms):
        if forms == "auto":
            report = json.loads(next(tmp_path.glob("*.json")).read_text())
            assert list(report["in_step"]) == ["off"] and report["in_step_pending"] == ["off", "auto", "on"][1:]
            raise KeyboardInterrupt
        return measured(options, device, steps, forms)

    monkeypatch.setattr(layers, "in_step_table", cut_off_at_auto)
    with pytest.raises(SystemExit) as stopped:  # exit_on_user_error: a Ctrl-C ends with status 130
        layers.main([*SMALL, "--in_step_steps", "1", "--out_dir", str(tmp_path)])
    assert stopped.value.code == 130
    [path] = tmp_path.glob("*.json")
    report = json.loads(path.read_text())
    assert len(report["layers"]) == 10 and all(row["ms"] > 0 for row in report["layers"])
    assert list(report["in_step"]) == ["off"] and report["in_step_pending"] == ["auto", "on"]
    text = path.with_suffix(".md").read_text()
    assert "| last | ConvTranspose3d |" in text and "--exact_forms=off, --jit_mode=none" in text
    assert "Not measured, the run having stopped before them: the step layer by layer with --exact_forms=auto, " \
           "--exact_forms=on." in text
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.with_suffix(".md").name]


def test_a_run_killed_by_sigterm_keeps_its_layer_table(tmp_path):
    """A real process, terminated (as a scheduler's time limit does) while it profiles the step: the layer table
    it measured first is on disk, whole."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import timeout_for

    # Enough profiled steps that the process is still profiling the first table when it is terminated.
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.layers", *SMALL, "--in_step_steps", "100000",
                                "--out_dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_for(60)
    try:
        while not list(tmp_path.glob("*.json")) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert process.poll() is None, "the run ended before it was terminated"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=timeout_for(10)) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
    [path] = tmp_path.glob("*.json")
    report = json.loads(path.read_text())
    assert len(report["layers"]) == 10 and report["in_step"] == {}
    assert report["in_step_pending"] == ["off", "auto", "on"]
    assert "| last | ConvTranspose3d |" in path.with_suffix(".md").read_text()


def test_a_list_of_layers_the_options_name_is_profiled_as_a_fourth_table(tmp_path):
    """``--exact_forms=[...]`` on the command line: the step is also profiled with that choice, so that a
    learner measures a choice of their own (e.g. the first and last layers alone) beside off, auto and on."""
    layers.main(["--preset", "cpu", "--out_dir", str(tmp_path), "--repeats", "1", "--in_step_steps", "1",
                 "--exact_forms=[down.0.0,last]"])
    [path] = tmp_path.glob("*-fp32.json")
    report = json.loads(path.read_text())
    assert list(report["in_step"]) == ["off", "auto", "on", "[down.0.0,last]"]
    chosen = report["in_step"]["[down.0.0,last]"]["forms"]
    assert {layer for layer, form in chosen.items() if form != "plain"} == {"down 1", "last"}
    assert chosen["down 1"] == "space-to-depth" and chosen["last"] == "sub-pixel"
    assert "--exact_forms=[down.0.0,last], --jit_mode=none: the layers" in path.with_suffix(".md").read_text()


@pytest.mark.cpu16
def test_a_layer_alone_does_what_the_step_does_for_it_and_nothing_more():
    """A layer timed alone takes its input in the autocast dtype (the layer before's output), so no cast of it is
    timed, and returns its gradients without adding them to earlier ones (a step's backward writes them once):
    the only casts are the weights', and the second call adds nothing up."""
    from torch.autograd import DeviceType

    from utils.optim import Precision

    conv = torch.nn.ConvTranspose3d(16, 8, kernel_size=4, stride=2, padding=1)
    shape = (2, 16, 8, 8, 8)
    call = layers.layer_call(conv, shape, False, Precision("bf16", torch.device("cpu")), torch.device("cpu"),
                             torch.channels_last_3d)
    call()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profiler:
        call()
    events = [event for event in profiler.events() if event.device_type == DeviceType.CPU]
    casts = [list(event.input_shapes[0]) for event in events if event.name == "aten::_to_copy"]
    assert casts and list(shape) not in casts  # the weight and bias are cast, the input is not
    assert not [event for event in events if event.name in ("aten::add_", "aten::add") and event.cpu_parent is not None
                and "AccumulateGrad" in event.cpu_parent.name]
