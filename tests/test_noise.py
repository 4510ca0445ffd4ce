"""utils/noise.py and the tools that use it, on real trials: when their spread makes a ranking noise, the
output says so instead of ranking."""
import json
import os

import pytest

from benchmarks import plot_scaling
from conftest import ROOT
from utils import benchy, noise

# benchy's trials (samples/s) of `train.py --config=demo --enable_benchy --Nsamples=64 --num_epochs=8` with
# 8 batches per trial, on the project's 2-core CPU machine on 2026-11-25 while other work held it at a load
# average of 7 to 9: SYNTHETIC's three trials differ by a factor of two.
BUSY = {"IO": [104.83375692967029, 107.82574453943815, 62.66303630846075],
        "SYNTHETIC": [2.642135180106261, 1.736748652866254, 1.337560951476445],
        "FULL": [1.3048392243903288, 1.0245045062122187, 1.0616986298679525]}
# The committed weak-scaling runs, made on the same machine on its own (2026-11-25).
IDLE = os.path.join(ROOT, "benchmarks", "results", "scaling", "cpu-vm-2-cores-2026-11-25")


def idle_trials(name):
    with open(os.path.join(IDLE, f"{name}.json")) as f:
        result = json.load(f)
    return {kind: result[kind]["trial_throughput"] for kind in ("IO", "SYNTHETIC", "FULL")}


def test_busy_trials_are_said_to_be_noise_and_idle_ones_are_not():
    assert noise.busy_line(BUSY) == "the machine was busy: 68% spread (SYNTHETIC 1.34 to 2.64); rerun on an idle machine"
    assert noise.busy_line(idle_trials("ddp_1")) is None  # spreads of 4-7%


def test_an_impossible_order_is_never_printed_as_a_finding():
    idle = idle_trials("noddp_2")
    above = [("SYNTHETIC", "FULL"), ("IO", "FULL")]
    assert noise.order_note(idle, above) is None  # FULL 159 below SYNTHETIC 165: as it must be
    # The busy machine's SYNTHETIC (about 2 samples/s) against the idle machine's FULL (84): FULL above
    # SYNTHETIC, and the busy note says why.
    mixed = {"SYNTHETIC": BUSY["SYNTHETIC"], "FULL": idle_trials("ddp_1")["FULL"]}
    assert noise.order_note(mixed, above) == ("the machine was busy: 68% spread (SYNTHETIC 1.34 to 2.64; FULL above "
                                              "SYNTHETIC: 84.1 against 1.91); rerun on an idle machine")
    # Steady trials in the wrong order: the load changed between them, which is the same sign.
    steady = {"SYNTHETIC": idle_trials("ddp_1")["SYNTHETIC"], "FULL": idle_trials("noddp_2")["FULL"]}
    assert noise.order_note(steady, above) == ("the machine was busy: 6% spread (FULL above SYNTHETIC: 159 against "
                                               "86.4); rerun on an idle machine")


def test_benchy_prints_the_note_under_its_summary_only_when_the_trials_are_noise(capsys):
    benchy.print_summary({kind: {"trial_throughput": trials} for kind, trials in BUSY.items()})
    busy = capsys.readouterr().out.splitlines()
    assert busy[3] == ("BENCHY::SUMMARY::Noise: the machine was busy: 68% spread (SYNTHETIC 1.34 to 2.64); rerun on "
                       "an idle machine. These throughputs rank nothing.")
    benchy.print_summary({kind: {"trial_throughput": trials} for kind, trials in idle_trials("ddp_1").items()})
    assert "Noise" not in capsys.readouterr().out


def test_the_scaling_table_prints_no_overhead_the_trials_cannot_separate_from_zero():
    _, ddp, noddp = plot_scaling.read_folder(IDLE)
    rows = plot_scaling.markdown_table(ddp, noddp, "CPU ranks", plot_scaling.folder_trials(IDLE)).splitlines()
    # One rank: DDP 83.1-85.3 against noddp 83.7-84.6, the same work: no overhead to speak of.
    assert rows[2] == "| 1 | 84.1 | 100.0% | 84.1 | within noise (trials vary 3%) |"
    assert rows[3] == "| 2 | 134.0 | 79.6% | 158.9 | 15.7% |"  # 132-135 against 154-162: separated
    assert len(rows) == 4  # no note: the trials are steady
    # The busy machine's trials as a one-rank pair: "DDP" (its SYNTHETIC trials) faster than "noddp" (its
    # FULL ones), a negative overhead: noise, said so, and why.
    table = plot_scaling.markdown_table({1: 1.91}, {1: 1.13}, "CPU ranks",
                                        {"ddp": {1: [BUSY["SYNTHETIC"]]}, "noddp": {1: [BUSY["FULL"]]}})
    assert "| 1 | 1.9 | - | 1.1 | within noise (trials vary 68%) |" in table
    assert table.endswith("Not a finding: the machine was busy: 68% spread (ddp at 1 1.34 to 2.64); rerun on an "
                          "idle machine.")


def test_profiles_do_not_rank_rungs_whose_steps_overlap():
    """benchmarks.profiles --preset cpu: the committed traces (the machine on its own) separate the two
    rungs; the step times of a run on 2026-11-25 at a load average of 11 (ms, the same two rungs) do not."""
    import gzip

    from benchmarks import profiles

    idle = []
    for rung in ("baseline", "gpu_inmem"):
        with gzip.open(os.path.join(ROOT, "example_logs", "cpu_profiles", f"{rung}.pt.trace.json.gz")) as f:
            idle.append({"rung": rung, **profiles.summarise_trace(json.load(f), steps=4)})
    assert len(idle[0]["step_ms"]) == 4 and profiles.ranking_notes(idle) == []
    busy = [{"rung": "baseline", "step_ms": [6110.023, 6445.424, 6615.476, 6556.497]},
            {"rung": "gpu_inmem", "step_ms": [5413.959, 4697.401, 6234.471, 4968.054]}]
    assert profiles.ranking_notes(busy) == [
        "", "Not a ranking (the steps' times overlap):", "",
        "- `gpu_inmem` against `baseline`: the machine was busy: 29% spread (gpu_inmem 4697 to 6234); rerun on "
        "an idle machine; the table does not rank them."]


def test_a_result_file_keeps_each_measurements_trials_and_their_summary():
    kept = noise.summary([3.0, 1.0, 2.0])
    assert kept == {"trials": [3.0, 1.0, 2.0], "mean": 2.0, "median": 2.0, "std": pytest.approx(0.8165, abs=1e-4),
                    "min": 1.0, "max": 3.0, "spread": 1.0}
    assert noise.summary([])["mean"] is None and noise.spread_text([5.0]) == "-" and noise.spread_text([1, 3]) == "100%"


def test_the_number_to_compare_is_set_beside_the_readmes_and_not_compared_when_busy():
    assert noise.compare_line("x", "6.8 times", "6.8 times", "f.json") == \
        "The number to compare (README): x: 6.8 times; the README's: 6.8 times (f.json)."
    busy = noise.busy_line(BUSY)
    assert noise.compare_line("x", "5.0 times", "6.8 times", "f.json", busy).endswith(
        f"(f.json). Not comparable: {busy}.")


def test_the_ladder_judges_every_rung_and_prints_the_readmes_ratio():
    """benchmarks.ladder --preset cpu: the committed run (the machine on its own; no trials kept then) is the
    README's 6.8; trials like those of a busy run (FULL above SYNTHETIC) say the machine was busy."""
    from benchmarks import ladder

    with open(os.path.join(ROOT, ladder.REFERENCE)) as f:
        committed = json.load(f)
    assert ladder.judgement(committed) is None
    assert ladder.compare_line(committed) == (
        "The number to compare (README): the GPU-resident loader's IO over the original's lowmem: 6.8 times (3419.5 "
        "against 505.1 samples/s); the README's: 6.8 times (3419.5 against 505.1) "
        "(benchmarks/results/cpu-vm-2-cores-2026-11-25.json).")
    busy = {**committed, "runs": [{**run, "trials": {"full": noise.summary([36.5, 36.0, 37.0]),
                                                     "synthetic": noise.summary([9.6, 9.5, 9.7]),
                                                     "io": noise.summary([500.0, 505.0, 510.0])}}
                                  for run in committed["runs"]]}
    assert ladder.judgement(busy) == (
        "the machine was busy: 3% spread (original's lowmem: 24 rotations, velocities not turned, 2 workers: FULL "
        "above SYNTHETIC: 36.5 against 9.6; 3 more such); rerun on an idle machine")
    table = ladder.markdown_table(busy)
    assert "| gpu-inmem on CPU tensors | 127.2 | 141.3 | 3419.5 | 3% / 2% / 2% |" in table
    assert table.endswith(f"Not a ranking: {ladder.judgement(busy)}.\n")
    assert ladder.compare_line(busy).endswith(f"Not comparable: {ladder.judgement(busy)}.")


def test_the_profiles_compare_the_median_forward_pass_and_say_when_steps_spread():
    from benchmarks import profiles

    idle = [{"rung": "baseline", "step_ms": [98.0, 97.0, 99.0], "forward_ms": [50.0, 51.0, 50.5]},
            {"rung": "gpu_inmem", "step_ms": [60.0, 61.0, 60.5], "forward_ms": [19.0, 19.2, 19.1]}]
    assert profiles.judgement(idle) is None
    assert profiles.forward_text(idle[0]) == ("forward pass per step: median 50.5 ms, the middle half of its 3 steps "
                                              "within 0% (mean 50.5 ms)")
    # An idle 2-core machine's baseline rung (2026-11-26): a lowmem worker's batch stalls one step in four, by
    # 1.4 times the median; the middle half of the steps agree, and no step is twice the median: not busy.
    stalls = [{"rung": "baseline", "step_ms": [134.5, 106.7, 108.7, 129.1, 108.3, 108.6, 107.6, 108.3, 129.2, 113.2,
                                               109.6, 109.7],
               "forward_ms": [68.8, 50.9, 53.7, 73.2, 52.5, 53.1, 52.6, 52.2, 71.4, 55.0, 53.6, 52.5]}]
    assert profiles.judgement(stalls) is None
    # Work beside it from the fourth step on: the middle half of the steps spreads.
    shared = [{"rung": "gpu_inmem", "step_ms": [80.0] * 4 + [150.0] * 8, "forward_ms": [27.0] * 4 + [60.0] * 8}]
    assert profiles.judgement(shared) == ("the machine was busy: 55% spread (gpu_inmem: forward: the middle half of its "
                                          "steps 27 to 60); rerun on an idle machine")
    assert profiles.compare_line(idle, None) == (
        "The number to compare (README): forward pass per step: 50.5 ms (baseline), 19.1 ms (gpu_inmem) (medians "
        "of the steps); the README's: 50.3 ms, 19.1 ms (means of 4 steps) (example_logs/cpu_profiles/profiles.json).")
    # One step of the load the issue saw (590.1 ms among about 35): the median stays, the line says busy.
    busy = [{"rung": "baseline", "step_ms": [70.0] * 11 + [620.0], "forward_ms": [35.5] * 11 + [590.1]}]
    assert profiles.forward_text(busy[0]).startswith("forward pass per step: median 35.5 ms, the middle half of its 12")
    assert profiles.judgement(busy).startswith("the machine was busy: 679% spread (baseline: forward 35.5 to 590)")
