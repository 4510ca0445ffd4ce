"""benchmarks/ladder.py's rungs without measuring them: the exact forms' switch, the local-batch sweep at the
best rung, and a domain case that cannot be split, each said in words."""
import argparse

from benchmarks import domain, ladder
from utils.YParams import load_params


def test_the_exact_forms_rung_passes_the_switch_through_and_is_skipped_where_the_config_lacks_it():
    exact = next(rung for rung in ladder.LADDER_RUNGS if "--exact_forms=on" in rung.options)
    below = next(rung for rung in ladder.LADDER_RUNGS if rung.name == "+ channels_last")
    # Where the config has the key: the rungs below the forms' own pass it off, the forms' rung on.
    assert ladder.ladder_options(below, exact_forms=True) == [*below.options, "--exact_forms=off"]
    assert ladder.ladder_options(exact, exact_forms=True) == exact.options
    assert ladder.skip_reason(exact, exact_forms=False) == "this tree's configuration has no exact_forms key " \
        "(--exact_forms)"
    # Without the key: nothing added; the rung is skipped with that reason, not failed.
    assert ladder.ladder_options(below, exact_forms=False) == below.options
    assert ladder.has_config_key("exact_forms") == ("exact_forms" in load_params(["--config=base"]))
    if ladder.has_config_key("exact_forms"):  # the key exists: the rung's options make a valid configuration
        assert load_params(["--config=base", *ladder.ladder_options(exact, True)]).exact_forms in ("on", True)


def test_the_batch_sweep_runs_at_the_best_measured_rung_and_is_skipped_on_a_cpu_with_its_reason(tmp_path):
    runs = [{"name": rung.name, "options": rung.options, "script": rung.script, "step": rung.step,
             "table": rung.table, "full": full, "synthetic": full + 50, "io": 30000.0, "mfu": None, "peak_mem_gb": 6.0}
            for rung, full in zip(ladder.LADDER_RUNGS, [900, 1350, 1400, 1670])]
    runs.append({"name": "skipped", "options": ["--data_loader_config=gpu-inmem"], "script": "train.py", "step": 99,
                 "error": "skipped: no compiler"})
    best = ladder.best_rung(runs)
    assert best.name == "+ channels_last"
    sweep = ladder.sweep_rungs(best)
    assert [rung.options[-1] for rung in sweep] == ["--global_batch_size=64", "--global_batch_size=128",
                                                    "--global_batch_size=256"]
    assert all(rung.options[:-1] == best.options and rung.table == "batch" for rung in sweep)
    report = {"runs": runs}
    args = argparse.Namespace(batch_sweep=[64, 128, 256], group="all")
    ladder.sweep(report, args, [], ladder.torch.device("cpu"), False, str(tmp_path / "base"))
    assert report["batch_sweep_skipped"].startswith("not measured with --preset cpu")
    table = ladder.markdown_table({**report, "command": "c", "device": "d", "torch": "t", "cuda": None, "date": "x"})
    assert "The local-batch sweep at the best rung: not measured with --preset cpu" in table


def test_a_domain_case_that_cannot_be_split_is_named():
    assert domain.skipped_cases([128, 256], [1, 2, 4], 64) == [(128, 4)]
