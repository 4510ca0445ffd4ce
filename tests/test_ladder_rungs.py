"""benchmarks/ladder.py's rungs without measuring them: the exact forms' switch, the local-batch sweep at the
best rung, and a domain case that cannot be split, each said in words."""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import domain, ladder
from conftest import ROOT, timeout_for
from utils.YParams import load_params


def test_the_exact_forms_rung_passes_the_switch_through_and_is_skipped_where_the_config_lacks_it():
    exact = next(rung for rung in ladder.LADDER_RUNGS if rung.name == "+ exact forms")
    below = next(rung for rung in ladder.LADDER_RUNGS if rung.name == "+ channels_last")
    alone = next(rung for rung in ladder.ALONE_RUNGS if rung.name == "exact forms")
    assert "--exact_forms=auto" in exact.options and "--exact_forms=on" in alone.options
    # Where the config has the key: the rungs below the forms' own pass it off, the forms' rung auto.
    assert ladder.ladder_options(below, exact_forms=True) == [*below.options, "--exact_forms=off"]
    assert ladder.ladder_options(exact, exact_forms=True) == exact.options
    for rung in (exact, alone):
        assert ladder.skip_reason(rung, exact_forms=False) == "this tree's configuration has no exact_forms key " \
            "(--exact_forms)"
    # Without the key: nothing added; the rung is skipped with that reason, not failed.
    assert ladder.ladder_options(below, exact_forms=False) == below.options
    assert ladder.has_config_key("exact_forms") == ("exact_forms" in load_params(["--config=base"]))
    if ladder.has_config_key("exact_forms"):  # the key exists: the rung's options make a valid configuration
        assert load_params(["--config=base", *ladder.ladder_options(exact, True)]).exact_forms == "auto"


def test_auto_decides_once_and_the_other_rungs_compute_with_its_layers():
    """The first rung measured with auto (the top of the ladder) decides; the rungs measured after it, and the
    batch sweep at the best, take its list of layers instead of timing again."""
    ladder_rungs = ladder.rungs_for("gpu", dali=False, group="ladder")
    with_auto = [rung.name for rung in ladder_rungs if "--exact_forms=auto" in rung.options]
    assert with_auto == ["+ compile's CUDA graphs (reduce-overhead)", "+ CUDA graph (train_graph.py)", "+ exact forms"]
    runs = [{"name": "skipped", "error": "skipped: no compiler"}, {"name": "on", "exact_forms": "on"},
            {"name": with_auto[0], "exact_forms": ["down.0.0", "last"]}, {"name": "later", "exact_forms": ["last"]}]
    assert ladder.decided_forms([]) is None and ladder.decided_forms(runs[:2]) is None
    decided = ladder.decided_forms(runs)
    assert decided == ["down.0.0", "last"] and ladder.decided_forms([{"exact_forms": []}]) == []
    exact = next(rung for rung in ladder_rungs if rung.name == "+ exact forms")
    options = ladder.ladder_options(exact, True, decided)
    assert options == [*exact.options[:-1], "--exact_forms=[down.0.0,last]"]
    assert load_params(["--config=base", *options]).exact_forms == ["down.0.0", "last"]
    alone = next(rung for rung in ladder.ALONE_RUNGS if rung.name == "exact forms")
    assert ladder.ladder_options(alone, True, decided) == alone.options  # on stays on
    table = ladder.markdown_table({"command": "c", "device": "d", "torch": "t", "cuda": None, "date": "x", "runs": [
        {"name": "+ exact forms", "step": 9, "table": "ladder", "full": 2.0, "synthetic": 2.0, "io": 3.0, "mfu": None,
         "peak_mem_gb": 1.0, "exact_forms": decided, "environment": ladder.rung_environment(options)},
        {"name": "+ AMP bf16", "step": 5, "table": "ladder", "full": 1.0, "synthetic": 1.0, "io": 3.0, "mfu": None,
         "peak_mem_gb": 1.0, "exact_forms": "off", "environment": {}}]})
    assert "| + exact forms (exact forms: down.0.0, last) | 2.0 |" in table and "| + AMP bf16 | 1.0 |" in table
    assert "The compiled rungs ran with TORCHINDUCTOR_FORCE_LAYOUT_OPT=1" in table


# Inductor's decision for the full-scale U-Net's training graph, plain and with every exact form, as a compiled
# rung's process makes it: the graph traced on the meta device, the decision the one a GPU's graph gets.
LAYOUT_DECISION = """
import json, types
import torch
from torch._inductor.graph import GraphLowering
from torch.fx.experimental.proxy_tensor import make_fx
from networks.UNet import UNet
from utils.exact_forms import use_exact_forms

decisions = {}
for forms in ("off", "on"):
    with torch.device("meta"):
        model = use_exact_forms(UNet(4, 5, 64, True), types.SimpleNamespace(exact_forms=forms), torch.device("meta"))
        graph = make_fx(model)(torch.empty(1, 4, 64, 64, 64))
    decisions[forms] = GraphLowering.decide_layout_opt(graph, is_inference=False)
print(json.dumps(decisions))
"""


@pytest.mark.slow
def test_the_compiled_rungs_hold_inductor_s_layout_optimisation_with_and_without_the_forms():
    """Every compiled rung's process gets the same environment, which holds Inductor's layout optimisation on:
    left to its heuristic, the sub-pixel form of the last layer (128 -> 40 channels) turns it off for the whole
    graph, and "+ exact forms" would differ from "+ torch.compile" in more than the forms."""
    compiled = [rung for rung in ladder.GPU_RUNGS if "--jit_mode=compile" in rung.options]
    assert {"+ torch.compile", "+ exact forms", "torch.compile"} <= {rung.name for rung in compiled}
    environments = [ladder.rung_environment(ladder.ladder_options(rung, True)) for rung in compiled]
    assert environments == [ladder.COMPILED_ENVIRONMENT] * len(compiled) and ladder.COMPILED_ENVIRONMENT
    assert all(ladder.rung_environment(ladder.ladder_options(rung, True)) == {}
               for rung in ladder.GPU_RUNGS if rung not in compiled)
    decisions = {}
    for held, extra in (("heuristic", {}), ("held", ladder.COMPILED_ENVIRONMENT)):
        environment = {key: value for key, value in os.environ.items() if not key.startswith("TORCHINDUCTOR_")}
        result = subprocess.run([sys.executable, "-c", LAYOUT_DECISION], cwd=ROOT, env={**environment, **extra},
                                capture_output=True, text=True, timeout=timeout_for(120))
        if result.returncode and "decide_layout_opt" in result.stderr and "KeyError: 'val'" in result.stderr:
            pytest.skip(f"torch {torch.__version__}'s Inductor reads shapes that make_fx does not record (torch 2.4)")
        assert result.returncode == 0, result.stderr[-3000:]
        decisions[held] = json.loads(result.stdout.strip().splitlines()[-1])
    assert decisions == {"heuristic": {"off": True, "on": False}, "held": {"off": True, "on": True}}


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


def test_only_takes_several_parts_of_names_and_refuses_one_that_names_no_rung(tmp_path, capsys):
    """--only A B: the rungs whose names hold either, in the ladder's order. A part that names a rung of another
    preset or group selects nothing here (gpu_suite.sh's CPU check passes the GPU's); a part that names no rung at
    all ends the run before it writes anything, naming the rungs it could have meant."""
    rungs = ladder.rungs_for("cpu")
    picked, elsewhere = ladder.select_rungs(rungs, ["gpu-inmem", "48 symmetries"], "--preset cpu")
    assert [rung.name for rung in picked] == ["lowmem: 48 symmetries, velocities turned, 2 workers",
                                              "gpu-inmem on CPU tensors"] and elsewhere == []
    assert ladder.select_rungs(rungs, [], "--preset cpu") == (rungs, [])
    picked, elsewhere = ladder.select_rungs(rungs, ["inmem", "compile's CUDA graphs"], "--preset cpu")
    assert [rung.name for rung in picked] == ["inmem, 2 workers", "gpu-inmem on CPU tensors"]
    assert elsewhere == ["compile's CUDA graphs"]
    gpu_ladder = ladder.rungs_for("gpu", dali=False, group="ladder")
    assert ladder.select_rungs(gpu_ladder, ["DALI"], "--preset gpu --group ladder") == ([], ["DALI"])
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        ladder.main(["--preset", "cpu", "--only", "gpu-inmem", "inmem, 2", "no such rung", "--out_dir", str(out)])
    error = " ".join(capsys.readouterr().err.split())
    assert exit.value.code == 2 and not out.exists()
    assert error.startswith("error: --only 'no such rung': no rung has a name that holds it. The rungs of --preset "
                            "cpu --group all:")
    assert all(f'"{rung.name}"' in error for rung in rungs) and "--only A B" in error
    assert "'gpu-inmem'" not in error and "'inmem, 2'" not in error  # the parts that match are not the problem


def test_a_domain_case_that_cannot_be_split_is_named():
    assert domain.skipped_cases([128, 256], [1, 2, 4], 64) == [(128, 4)]
