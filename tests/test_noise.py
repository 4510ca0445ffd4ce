"""utils/noise.py and the tools that use it, on real trials: when their spread makes a ranking noise, the
output says so instead of ranking."""
import json
import os

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
        "- `gpu_inmem` against `baseline`: the machine was busy: 29% spread (gpu_inmem 4.7e+03 to 6.23e+03); rerun on "
        "an idle machine; the table does not rank them."]
