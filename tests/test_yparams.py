"""Configs: every named config loads, overrides parse as the tutorial's users type them, mistakes are refused."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import timeout_for
from readme_commands import tutorial_text
from utils.YParams import YParams, load_params, parse_command_line, read_yaml
from utils.errors import UserError

ROOT = Path(__file__).resolve().parent.parent

CONFIG = "config/UNet.yaml"
ORIGINAL_CONFIGS = ("base", "short", "short_opt", "bs64_opt", "bs256_opt", "bs512_test", "bs512_opt",
                    "bs2048_opt", "bs8192_opt")


@pytest.mark.parametrize("name", ORIGINAL_CONFIGS + ("demo", "demo_bs32_test", "demo_bs32_opt", "test"))
def test_every_config_loads_and_validates(name):
    params = load_params([f"--config={name}"])
    assert params.config == name
    assert params.global_batch_size > 0 and params.crop_size > 0


def test_anchors_and_merge_keys_inherit():
    base, short, short_opt = (YParams(CONFIG, name) for name in ("base", "short", "short_opt"))
    assert short.crop_size == base.crop_size == 64
    assert (short.Nsamples, short.Nsamples_val, short.num_epochs) == (4096, 512, 4)
    assert (short_opt.Nsamples, short_opt.amp_mode, short_opt.num_data_workers) == (4096, "fp16", 8)
    assert YParams(CONFIG, "bs8192_opt").global_batch_size == 8192


def test_attribute_access_and_update():
    params = YParams(CONFIG, "demo")
    params.update({"num_epochs": 7})
    assert params.num_epochs == params["num_epochs"] == 7
    with pytest.raises(AttributeError):
        params.no_such_key


def test_override_forms_and_yaml_values():
    params = load_params(["--config=demo", "--num_epochs", "3", "--start_lr=1e-3", "--device=cpu",
                                   "--nbody_vector_channels=[1,2,3]", "--noddp", "--run_num=01", "--resume"])
    assert params.num_epochs == 3 and isinstance(params.num_epochs, int)
    assert params.start_lr == 1e-3 and isinstance(params.start_lr, float)
    assert params.device == "cpu" and params.noddp is True
    assert params.nbody_vector_channels == [1, 2, 3]
    assert params.run_num == "01" and params.resume is True


def test_original_flags_keep_their_names():
    options, overrides = parse_command_line(["--yaml_config", CONFIG, "--config", "short", "--amp_mode", "fp16",
                                             "--enable_apex", "--num_data_workers", "8", "--local_batch_size",
                                             "16", "--bucket_cap_mb", "100", "--disable_broadcast_buffers"])
    assert options["config"] == "short" and options["local_batch_size"] == 16
    assert overrides == {"amp_mode": "fp16", "enable_apex": True, "num_data_workers": 8, "bucket_cap_mb": 100,
                         "disable_broadcast_buffers": True}


def test_unknown_key_suggests_the_closest():
    with pytest.raises(UserError, match="num_epochs"):
        load_params(["--config=demo", "--num_epoch=3"])


@pytest.mark.parametrize("typed, suggested", [("--lr=1e-3", "Did you mean 'start_lr', 'end_lr' or 'lr_scaling'?"),
                                               ("--epochs=3", "Did you mean 'num_epochs'?")])
def test_an_unknown_key_that_is_part_of_valid_ones_suggests_them(typed, suggested):
    with pytest.raises(UserError, match=re.escape(suggested)):
        load_params(["--config=demo", typed])


def test_unknown_config_lists_valid_names():
    with pytest.raises(UserError, match="Did you mean 'short'.*Valid configs:.*bs64_opt"):
        load_params(["--config=shrot"])


def test_missing_config_file():
    with pytest.raises(UserError, match="does not exist"):
        load_params(["--yaml_config=nope.yaml"])


@pytest.mark.parametrize("override, message", [
    ("--global_batch_size=-8", "positive integer"),
    ("--graph_warmup_steps=0", "positive integer"),
    ("--profile_steps=many", "positive integer"),  # null in the config: any type gets through the parser  # the capture needs cuDNN's choices and Adam's state made
    ("--crop_size=abc", "wrong type"),
    ("--amp_mode=fp8", "valid choice"),
    ("--num_data_workers=-1", "must not be negative"),
    ("--hydro_vector_channels=[2,3,9]", "velocity"),
    ("--Nsamples=4", "no step"),
])
def test_invalid_values_are_refused(override, message):
    with pytest.raises(UserError, match=message):
        load_params(["--config=demo", override])


def test_config_file_is_safe_yaml():
    # Anchors and merge keys need no unsafe loader; a plain safe load sees every config.
    with open(CONFIG) as f:
        configs = read_yaml(f)
    assert set(ORIGINAL_CONFIGS) | {"demo", "test"} <= set(configs)


# ----------------------------------------------------------------------------- YAML 1.2, as the original reads it

def test_numbers_and_nulls_read_as_the_original_reads_them(tmp_path):
    """In the file and on the command line: 1e-3 is a float (PyYAML's YAML 1.1 makes it a string), the
    string None is null (the original's YParams), anchors and merge keys inherit."""
    config = tmp_path / "mine.yaml"
    config.write_text((ROOT / CONFIG).read_text() + """
mine: &mine
  <<: *demo
  start_lr: 1e-3
  end_lr: 5E-4
  lambda_rho: .5
  profile_steps: None
  profile_start_epoch: null
mine_child:
  <<: *mine
  num_epochs: 3
""")
    params = load_params([f"--yaml_config={config}", "--config=mine_child"])
    assert (params.start_lr, params.end_lr, params.lambda_rho) == (1e-3, 5e-4, 0.5)
    assert all(isinstance(params[key], float) for key in ("start_lr", "end_lr", "lambda_rho"))
    assert params.profile_steps is None and params.profile_start_epoch is None
    assert params.num_epochs == 3 and params.crop_size == 32  # from mine, from demo, from base
    params = load_params(["--config=demo", "--start_lr=1e-3", "--end_lr", "5E-4", "--lambda_rho=.5",
                          "--profile_steps=None", "--profile_start_epoch=null"])
    assert (params.start_lr, params.end_lr, params.lambda_rho) == (1e-3, 5e-4, 0.5)
    assert params.profile_steps is None and params.profile_start_epoch is None


@pytest.mark.parametrize("override, message", [
    ("--start_lr=fast", "--start_lr=fast has the wrong type: 'start_lr' takes a number"),
    ("--start_lr=.nan", "'start_lr' must be finite"),
    ("--num_epochs", "--num_epochs needs a value: 'num_epochs' takes an integer, e.g. --num_epochs=4"),
    ("--num_epochs=2.5", "'num_epochs' takes an integer"),
    ("--full_scale=maybe", "'full_scale' takes true or false"),
])
def test_a_value_of_the_wrong_type_names_the_key(override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_params(["--config=demo", override])


def test_a_config_file_missing_because_of_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"not in the folder you run from .*Run from there \(cd "):
        load_params(["--config=demo"])


# ----------------------------------------------------------------------------- --help

@pytest.mark.parametrize("script, flag", [("train.py", "--help"), ("train.py", "-h"), ("train_graph.py", "--help")])
def test_help_lists_every_option_with_its_value(script, flag, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / script), "--config=demo", flag], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"usage: python {script} [--config=NAME] [--key=value | --key value | --flag] ..."
    options = {match.group(1): match.group(2) for match in map(OPTION_LINE.match, lines) if match}
    params = load_params(["--config=demo"])
    assert set(options) == set(params.keys())  # the run options and every key of the config
    assert options["crop_size"] == "32" and options["config"] == "demo"  # demo's values, not base's
    assert options["amp_mode"] == "none" and "--amp_mode=none|bf16|fp16" in result.stdout
    assert lines.index("run options:") < min(i for i, line in enumerate(lines) if line.startswith("model "))
    assert "a 6th level" in result.stdout  # each key's comment in the config file


OPTION_LINE = re.compile(r"  --(\w+)=\S+\s+(\S+)")


# The original tutorial's configs (config/UNet.yaml of NERSC/sc22-dl-tutorial), in this repository's
# key names: data_size -> crop_size, lr_schedule.scaling -> lr_scaling; the _opt configs' 8 DALI threads
# as the tutorial's README passed them (--num_data_workers 8; the original's file inherited base's 2).
# Every key the original sets is pinned; the data paths and expdir differ on purpose (README, "What
# differs from the original").
ORIGINAL_BASE = {"full_scale": True, "N_out_channels": 5, "lambda_rho": 0.0, "global_batch_size": 64,
                 "base_batch_size": 64, "Nsamples": 65536, "Nsamples_val": 8192, "num_epochs": 10,
                 "amp_mode": "none", "enable_apex": False, "enable_benchy": False, "enable_jit": False,
                 "lr_scaling": "sqrt", "start_lr": 2e-4, "end_lr": 0.0, "warmup_steps": 128,
                 "data_loader_config": "lowmem", "crop_size": 64, "num_data_workers": 2}
OPTIMISED = {"data_loader_config": "dali-lowmem", "num_data_workers": 8, "amp_mode": "fp16", "enable_apex": True,
             "enable_jit": True}
ORIGINAL_VALUES = {
    "base": {},
    "short": {"Nsamples": 4096, "Nsamples_val": 512, "num_epochs": 4},
    "short_opt": {"Nsamples": 4096, "Nsamples_val": 512, "num_epochs": 4, **OPTIMISED},
    "bs64_opt": {**OPTIMISED},
    "bs256_opt": {**OPTIMISED, "global_batch_size": 256, "num_epochs": 20},
    "bs512_test": {**OPTIMISED, "global_batch_size": 512},
    "bs512_opt": {**OPTIMISED, "global_batch_size": 512, "num_epochs": 40},
    "bs2048_opt": {**OPTIMISED, "global_batch_size": 2048, "num_epochs": 160},
    "bs8192_opt": {**OPTIMISED, "global_batch_size": 8192, "num_epochs": 320},
}


@pytest.mark.parametrize("name", ORIGINAL_CONFIGS)
def test_the_original_configs_keep_the_originals_values(name):
    params = YParams(CONFIG, name)
    expected = {**ORIGINAL_BASE, **ORIGINAL_VALUES[name]}
    assert {key: params[key] for key in expected} == expected


def test_the_opt_configs_have_the_workers_the_readme_states():
    """Every place the README gives the _opt configs' DALI threads names what the configs set."""
    readme = tutorial_text(ROOT)  # README.md and its chapters in docs/
    stated = re.findall(r"`dali-lowmem`\s+with\s+(\d+)\s+(?:workers|DALI threads)", readme)
    assert len(stated) >= 2, "the README states the _opt configs' DALI threads"
    for name in ORIGINAL_CONFIGS:
        if name.endswith("_opt"):
            assert {str(YParams(CONFIG, name).num_data_workers)} == set(stated), name


def test_the_original_flags_keep_their_defaults():
    """train.py's argparse defaults in the original, for a command line that names only the config."""
    params = load_params(["--config=base"])
    assert (params.run_num, params.yaml_config, params.local_batch_size) == ("00", CONFIG, None)
    assert load_params([]).config == "base"
    assert params.bucket_cap_mb == 25 and not params.disable_broadcast_buffers and not params.noddp
    assert not params.gradient_as_bucket_view  # DDP's default; the original's flag no longer switches it on
    assert not (params.enable_manual_profiling or params.enable_benchy or params.enable_apex or params.enable_jit)
    assert params.amp_mode == "none"
    params = load_params(["--config=base", "--amp_mode=bf16", "--data_loader_config=inmem"])
    assert (params.amp_mode, params.data_loader_config) == ("bf16", "inmem")


def test_the_run_options_and_the_config_are_resolved_into_one_object():
    """--local_batch_size sets the global batch for the world size; the nulls the caller fills are filled."""
    params = load_params(["--config=demo", "--local_batch_size=3", "--run_num=x"], world_size=2,
                         null_defaults={"profile_start_epoch": 4, "profile_steps": 60})
    assert (params.global_batch_size, params.local_batch_size, params.run_num) == (6, 3, "x")
    assert (params.profile_start_epoch, params.profile_steps) == (4, 60)
    assert list(params.to_dict())[:5] == ["yaml_config", "config", "run_num", "resume", "local_batch_size"]
    params = load_params(["--config=demo", "--profile_steps=7"], null_defaults={"profile_steps": 60})
    assert params.profile_steps == 7  # what the user gives stays


def test_under_a_domain_mesh_the_batch_splits_over_the_data_parallel_groups():
    """8 ranks in domain groups of 4 are 2 data-parallel groups: --local_batch_size=3 makes a global batch of 6."""
    params = load_params(["--config=domain_demo", "--domain_mesh=[4,1,1]", "--local_batch_size=3"], world_size=8)
    assert (params.domain_mesh, params.global_batch_size) == ([4, 1, 1], 6)
    assert load_params(["--config=domain_demo"], world_size=2).global_batch_size == 2  # one group: the config's


def test_a_global_batch_that_does_not_divide_over_the_ranks_is_refused():
    with pytest.raises(UserError, match="global_batch_size=8 does not divide over 3 ranks"):
        load_params(["--config=demo"], world_size=3)
    with pytest.raises(UserError, match="--local_batch_size=0 is invalid"):
        load_params(["--config=demo", "--local_batch_size=0"], world_size=2)


def test_exact_forms_takes_a_mode_or_a_list_of_layers_and_a_resume_s_list_can_be_overridden():
    """--exact_forms: auto | on | off, or a list of layer names (what auto's choice is recorded as)."""
    assert load_params(["--config=base", "--exact_forms=[down.0.0,last]"]).exact_forms == ["down.0.0", "last"]
    assert load_params(["--config=base", "--exact_forms=[]"]).exact_forms == []
    resumed = {"exact_forms": ["last"]}  # a run's config.yaml after auto chose the last layer
    assert load_params(["--config=base"], saved=resumed).exact_forms == ["last"]
    assert load_params(["--config=base", "--exact_forms=off"], saved=resumed).exact_forms == "off"
    with pytest.raises(UserError, match="--exact_forms=True has the wrong type"):
        load_params(["--config=base", "--exact_forms=true"])
