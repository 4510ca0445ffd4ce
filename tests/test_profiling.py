"""utils/profiling.py: annotate, the profiling window, memory snapshots and the up-front checks (CPU)."""
import glob
import json
import logging

import pytest
import torch

from utils import profiling
from utils.distributed import World
from utils.errors import UserError
from utils.profiling import (DEFAULT_WINDOWS, Profiling, annotate, check_profiling_options, disable_annotations,
                             enable_annotations)
from utils.YParams import YParams, load_params

CPU = torch.profiler.ProfilerActivity.CPU


@pytest.fixture(autouse=True)
def annotations_off():
    """Every test starts and ends with the module switch off: it is process-wide state."""
    disable_annotations()
    yield
    disable_annotations()


def params_for(**overrides):
    params = YParams("config/UNet.yaml", "test")
    params.update({**DEFAULT_WINDOWS["train.py"], **overrides})
    return params


MAIN, OTHER = World(2, 0, 0), World(2, 1, 1)


def recorded_names(function):
    with torch.profiler.profile(activities=[CPU]) as prof:
        function()
    return {event.key for event in prof.key_averages()}


def tiny_op():
    return torch.ones(8) * 2


def train_loop(profiler, epochs, steps_per_epoch):
    """The shape of train.py's loop: the hook, then the step inside its range."""
    step = 0
    with profiler:
        for _ in range(epochs):
            for _ in range(steps_per_epoch):
                profiler.step(step)
                with annotate("step", step):
                    tiny_op()
                step += 1


# ----------------------------------------------------------------------------- annotate

def test_annotate_records_named_ranges_when_on():
    enable_annotations()

    def work():
        with annotate("forward"):
            tiny_op()
        with annotate("step", 7):
            tiny_op()

    names = recorded_names(work)
    assert {"forward", "step 7"} <= names


def test_annotate_when_off_is_one_shared_null_context(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("record_function called while profiling is off")

    monkeypatch.setattr(torch.profiler, "record_function", refuse)
    assert annotate("forward") is annotate("step", 2)  # nothing allocated, the index not even formatted
    with annotate("forward"):
        assert tiny_op().sum() == 16


def test_annotate_off_leaves_profiler_traces_clean():
    def work():
        with annotate("forward"):
            tiny_op()

    assert "forward" not in recorded_names(work)


def test_nvtx_is_never_called_on_cpu(monkeypatch, tmp_path, caplog):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(name))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    caplog.set_level(logging.INFO)
    profiler = Profiling(params_for(enable_manual_profiling=True, profile_start_epoch=1, profile_steps=2),
                         MAIN, torch.device("cpu"), str(tmp_path), steps_per_epoch=3)
    assert profiling.annotations_enabled()
    names = recorded_names(lambda: train_loop(profiler, epochs=1, steps_per_epoch=3))
    assert calls == []
    assert {"step 0", "step 1", "step 2"} <= names  # record_function ranges only
    assert "no CUDA profiler window" in caplog.text
    assert not profiling.annotations_enabled()  # switched off again when the loop ends


def test_nvtx_request_on_a_cpu_build_falls_back_to_profiler_ranges():
    enable_annotations(nvtx=True)  # a CPU build raises "NVTX functions not installed": probed once
    names = recorded_names(lambda: annotate("forward").__enter__().__exit__(None, None, None))
    assert "forward" in names


# ----------------------------------------------------------------------------- the controller

def test_everything_off_costs_one_test(tmp_path, monkeypatch):
    profiler = Profiling(params_for(), MAIN, torch.device("cuda"), str(tmp_path), steps_per_epoch=4)
    assert not profiler.active
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: pytest.fail("step() did work while off"))
    train_loop(profiler, epochs=2, steps_per_epoch=4)
    assert not profiling.annotations_enabled()
    assert list(tmp_path.iterdir()) == []


def test_torch_profiler_traces_exactly_the_window(tmp_path):
    params = params_for(profiler="torch", profile_start_epoch=2, profile_steps=2, num_epochs=3)
    profiler = Profiling(params, MAIN, torch.device("cpu"), str(tmp_path), steps_per_epoch=3)
    train_loop(profiler, epochs=3, steps_per_epoch=3)  # the window: global steps 3 and 4

    traces = glob.glob(str(tmp_path / "profile" / "*.pt.trace.json"))
    assert traces == profiler.trace_files and len(traces) == 1
    with open(traces[0]) as f:
        events = json.load(f)["traceEvents"]
    steps = {event["name"] for event in events if event.get("name", "").startswith("step ")}
    assert steps == {"step 3", "step 4"}


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")  # a window from step 0 has none
def test_torch_profiler_window_cut_short_is_still_written(tmp_path):
    params = params_for(profiler="torch", profile_start_epoch=1, profile_steps=50, num_epochs=20)
    profiler = Profiling(params, MAIN, torch.device("cpu"), str(tmp_path), steps_per_epoch=3)
    train_loop(profiler, epochs=1, steps_per_epoch=3)  # the run ends (or fails) inside the window
    with open(profiler.trace_files[0]) as f:
        names = {event.get("name") for event in json.load(f)["traceEvents"]}
    assert {"step 0", "step 1", "step 2"} <= names


def test_torch_profiler_runs_on_rank_0_only(tmp_path):
    params = params_for(profiler="torch", profile_start_epoch=1, profile_steps=2)
    profiler = Profiling(params, OTHER, torch.device("cpu"), str(tmp_path), steps_per_epoch=3)
    train_loop(profiler, epochs=1, steps_per_epoch=3)
    assert not (tmp_path / "profile").exists()


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
@pytest.mark.parametrize("start_step, traced", [(4, {"step 4"}), (2, {"step 3", "step 4"}), (5, set())])
def test_a_resumed_run_traces_what_is_left_of_the_window(tmp_path, start_step, traced):
    params = params_for(profiler="torch", profile_start_epoch=2, profile_steps=2, num_epochs=3)
    profiler = Profiling(params, MAIN, torch.device("cpu"), str(tmp_path), steps_per_epoch=3, start_step=start_step)
    with profiler:
        for step in range(start_step, 9):
            profiler.step(step)
            with annotate("step", step):
                tiny_op()
    names = set()
    for path in profiler.trace_files:
        with open(path) as f:
            names |= {e["name"] for e in json.load(f)["traceEvents"] if e.get("name", "").startswith("step ")}
    assert names == traced and len(profiler.trace_files) == (1 if traced else 0)


def fake_cuda(monkeypatch, calls, current_step):
    """Stand-ins for the CUDA calls, recording (call, global step) instead of needing a GPU."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append(("start", current_step[0])))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append(("stop", current_step[0])))

    def record(*args, enabled="all", **kwargs):
        calls.append(("record" if enabled else "stop recording", current_step[0]))
        if enabled:
            assert kwargs.get("stacks") == "python"  # C++ stacks take minutes to symbolise

    def dump(path):
        calls.append(("dump", current_step[0]))
        with open(path, "wb") as f:
            f.write(b"snapshot")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)


def run_steps(profiler, steps, current_step):
    with profiler:
        for step in range(steps):
            current_step[0] = step
            profiler.step(step)


@pytest.mark.parametrize("world", [MAIN, OTHER])
def test_cuda_profiler_window_opens_at_start_epoch_on_every_rank(tmp_path, monkeypatch, world):
    """Every rank opens the window: under Slurm each rank's nsys writes its own report."""
    calls, current = [], [None]
    fake_cuda(monkeypatch, calls, current)
    params = params_for(enable_manual_profiling=True, profile_start_epoch=2, profile_steps=3, num_epochs=3)
    profiler = Profiling(params, world, torch.device("cuda"), str(tmp_path), steps_per_epoch=4)
    run_steps(profiler, 12, current)
    # Epoch 2 (1-based) begins at global step 4; stop() comes before step 7, after 3 steps.
    assert calls == [("start", 4), ("stop", 7)]


def test_memory_snapshot_records_the_first_steps_and_dumps_once(tmp_path, monkeypatch):
    calls, current = [], [None]
    fake_cuda(monkeypatch, calls, current)
    params = params_for(memory_snapshot=True, memory_snapshot_steps=3)
    profiler = Profiling(params, MAIN, torch.device("cuda"), str(tmp_path), steps_per_epoch=4)
    run_steps(profiler, 8, current)
    assert calls == [("record", None), ("dump", 3), ("stop recording", 3)]  # recording starts before step 0
    assert (tmp_path / "memory_snapshot.pickle").read_bytes() == b"snapshot"


def test_memory_snapshot_is_dumped_on_out_of_memory(tmp_path, monkeypatch):
    calls, current = [], [None]
    fake_cuda(monkeypatch, calls, current)
    profiler = Profiling(params_for(memory_snapshot=True, memory_snapshot_steps=100), MAIN,
                         torch.device("cuda"), str(tmp_path), steps_per_epoch=4)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with profiler:
            profiler.step(0)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    assert (tmp_path / "memory_snapshot_oom_rank0.pickle").exists()
    assert (tmp_path / "memory_snapshot.pickle").exists()  # the history so far, dumped on the way out


def test_memory_snapshot_on_cpu_logs_and_does_nothing_else(tmp_path, monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise AssertionError("CUDA memory call on the CPU")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", refuse)
    caplog.set_level(logging.INFO)
    profiler = Profiling(params_for(memory_snapshot=True), MAIN, torch.device("cpu"), str(tmp_path),
                         steps_per_epoch=4)
    train_loop(profiler, epochs=2, steps_per_epoch=4)
    assert "CUDA memory snapshots need a GPU" in caplog.text
    assert not profiler.active
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the up-front checks

def test_profiling_options_off_are_not_checked():
    check_profiling_options(params_for(profile_start_epoch=40), steps_per_epoch=4)


@pytest.mark.parametrize("option", [{"enable_manual_profiling": True}, {"profiler": "torch"}])
def test_window_after_the_last_epoch_is_refused(option):
    with pytest.raises(UserError, match=r"profile_start_epoch=4, but the run has only num_epochs=2"):
        check_profiling_options(params_for(profile_start_epoch=4, **option), steps_per_epoch=4)


def test_window_running_past_the_last_step_is_refused():
    params = params_for(enable_manual_profiling=True, profile_start_epoch=2, profile_steps=60)
    with pytest.raises(UserError, match=r"--profile_steps=4 or less"):
        check_profiling_options(params, steps_per_epoch=4)
    params.update({"profile_steps": 4})
    check_profiling_options(params, steps_per_epoch=4)  # the last 4 steps: fits exactly


@pytest.mark.parametrize("option", [{"enable_manual_profiling": True}, {"profiler": "torch"}])
def test_benchy_with_a_profiler_is_refused(option):
    params = params_for(enable_benchy=True, profile_start_epoch=1, num_epochs=20, **option)
    with pytest.raises(UserError, match="cannot be combined"):
        check_profiling_options(params, steps_per_epoch=4)


def test_range_name_recovers_what_annotate_was_given():
    from utils.profiling import range_name

    assert [range_name(n) for n in ("step 7", "data copy in 12", "forward", "ProfilerStep#3", "7")] == \
        ["step", "data copy in", "forward", "ProfilerStep#3", "7"]


def test_the_default_windows_are_the_original_tutorials():
    """Null in the config: train.py profiles the 4th epoch for 60 steps, train_graph.py the 2nd for 30."""
    for script, window in (("train.py", (4, 60)), ("train_graph.py", (2, 30))):
        params = load_params(["--config=test"], null_defaults=DEFAULT_WINDOWS[script])
        assert (params.profile_start_epoch, params.profile_steps) == window
    params = load_params(["--config=test", "--profile_steps=7"], null_defaults=DEFAULT_WINDOWS["train_graph.py"])
    assert (params.profile_start_epoch, params.profile_steps) == (2, 7)  # what the user gives stays
