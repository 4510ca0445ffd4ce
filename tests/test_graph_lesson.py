"""benchmarks/graph_lesson.py: what runs without a GPU (its settings, the eager side's timing, the table and
the refusal); the graph side and the numbers need a CUDA GPU (benchmarks/suite/gpu_suite.sh)."""
import argparse
import json

import pytest
import torch

from benchmarks import graph_lesson


def arguments(**given):
    defaults = {"batches": None, "no_production": False, "extra": "", "steps": 2, "trials": 2, "warmup": 1}
    return argparse.Namespace(**{**defaults, **given})


def test_the_points_are_the_launch_bound_setting_then_production():
    chosen = graph_lesson.points(arguments())
    assert [(setting, batch) for setting, batch, _ in chosen] == [
        ("launch-bound", 1), ("launch-bound", 2), ("launch-bound", 4), ("launch-bound", 8), ("production", 64)]
    _, _, options = chosen[0]
    assert {"--config=demo", "--crop_size=32", "--global_batch_size=1", "--amp_mode=bf16", "--enable_fused"} <= \
        set(options)
    assert {"--config=base", "--crop_size=64", "--global_batch_size=64"} <= set(chosen[-1][2])
    # Both sides of every point build the same layers, plain: none times the exact forms first.
    assert all("--exact_forms=off" in options for _, _, options in chosen)
    fewer = graph_lesson.points(arguments(batches=[2], no_production=True, extra="--channels_last"))
    assert [(setting, batch) for setting, batch, _ in fewer] == [("launch-bound", 2)]
    assert fewer[0][2][-1] == "--channels_last"


def test_the_eager_side_is_timed_by_the_hosts_clock():
    options = ["--config=demo", "--crop_size=32", "--global_batch_size=1", "--device=cpu", "--checkpoint=false",
               "--base_channels=4"]
    trials = graph_lesson.measure_point(options, arguments(steps=2, trials=3), graph=False)
    assert len(trials) == 3 and all(ms > 0 for ms in trials)
    calls = []
    per_step = graph_lesson.time_steps(lambda x, y: calls.append(1), None, None, steps=4, trials=2,
                                       synchronize=lambda: calls.append("sync"))
    assert len(per_step) == 2 and calls == ["sync", 1, 1, 1, 1, "sync"] * 2  # no wait inside a trial


def test_the_table_gives_medians_spreads_and_the_ratio_and_says_when_trials_cannot_compare():
    steady = graph_lesson.row("launch-bound", 1, [10.0, 10.2, 10.1], [5.0, 5.1, 5.0])
    assert steady["speedup"] == pytest.approx(10.1 / 5.0)
    report = {"command": "python -m benchmarks.graph_lesson", "device": "GPU", "torch": "t", "cuda": "c",
              "date": "d", "steps": 100, "trials": 3,
              "points": [steady, {"setting": "production", "local_batch": 64, "error": "out of memory"}]}
    table = graph_lesson.markdown_table(report)
    assert "| launch-bound | 1 | 10.10 | 2% | 5.00 | 2% | 2.02 |" in table
    assert "| production | 64 | failed: out of memory |" in table and "Not a comparison" not in table
    report["points"].append(graph_lesson.row("launch-bound", 2, [10.0, 20.0, 11.0], [5.0, 5.1, 5.0]))
    assert graph_lesson.markdown_table(report).endswith(
        "Not a comparison: the machine was busy: 73% spread (launch-bound, batch 2: eager 10 to 20); rerun on an "
        "idle machine.\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_refuses_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        graph_lesson.main(["--out_dir", str(tmp_path / "out")])
    assert exit.value.code != 0 and "need a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        graph_lesson.main(["--steps", "0"])


@pytest.mark.slow
def test_the_report_is_written_after_every_point(tmp_path):
    """A run stopped during a point (here by Ctrl-C, as the suite's SIGINT at its budget) keeps the points
    before it; both sides here are the eager step on the CPU (the graph side needs a GPU)."""
    options = ["--config=demo", "--crop_size=32", "--device=cpu", "--checkpoint=false", "--base_channels=4",
               "--exact_forms=off"]
    chosen = [("launch-bound", batch, [*options, f"--global_batch_size={batch}"]) for batch in (1, 2, 3)]
    measured = []

    def measure(options, args, graph):
        if options[-1] == "--global_batch_size=3":
            raise KeyboardInterrupt
        measured.append(graph)
        return graph_lesson.measure_point(options, args, graph=False)

    report = {"command": "c", "device": "d", "torch": "t", "cuda": None, "date": "x", "steps": 2, "trials": 2,
              "points": []}
    with pytest.raises(KeyboardInterrupt):
        graph_lesson.measure_points(report, str(tmp_path / "cpu"), chosen, arguments(steps=1, trials=2), measure)
    assert measured == [False, True] * 2
    written = json.loads((tmp_path / "cpu.json").read_text())
    assert [point["local_batch"] for point in written["points"]] == [1, 2]
    assert "| launch-bound | 2 |" in (tmp_path / "cpu.md").read_text()
