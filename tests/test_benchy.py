"""utils/benchy.py and benchmarks/trials.py: the built-in benchy trials and their output (CPU), and the
GitHub benchy's adapter (on a stand-in module)."""
import copy
import json
import os
import re
import sys

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from networks.UNet import UNet
from benchmarks.trials import run_trials
from utils import benchy, conv3d
from utils.benchy import BenchyLoader, check_benchy_options, load_benchy_config, wrap_for_benchy
from utils.distributed import World
from utils.errors import UserError
from utils.flops import precision_of
from utils.YParams import YParams

NBATCHES, NTRIALS, NWARMUP = 3, 2, 1
SUMMARY = re.compile(r"^BENCHY::SUMMARY::(IO|\ SYNTHETIC|FULL) average trial throughput: "
                     r"(\d+\.\d{3}) \+/- (\d+\.\d{3})$", re.MULTILINE)
BENCHY_YAML = f"""
global:
  report_freq: 1
IO:
  nbatches: {NBATCHES}
  ntrials: {NTRIALS}
  nwarmup: {NWARMUP}
synthetic:
  nbatches: {NBATCHES}
  ntrials: {NTRIALS}
  nwarmup: {NWARMUP}
full:
  nbatches: {NBATCHES}
  ntrials: {NTRIALS}
  nwarmup: {NWARMUP}
"""
EPOCHS = 2 * (NWARMUP + NTRIALS)  # one SYNTHETIC or FULL trial per epoch


class CountingLoader:
    """A DataLoader that counts the batches fetched from it, with the attributes train.py uses.

    ``crop=32`` feeds the tiny U-Net of the `test` config; tests without a model use smaller crops.
    """

    def __init__(self, num_batches=8, batch_size=4, crop=32):
        inputs = torch.randn(num_batches * batch_size, 4, crop, crop, crop)
        targets = torch.randn(num_batches * batch_size, 5, crop, crop, crop)
        dataset = TensorDataset(inputs, targets)
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)  # has set_epoch
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
        self.batch_size = batch_size
        self.sampler = self.loader.sampler
        self.fetched = 0

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.fetched += 1
            yield batch


@pytest.fixture
def params():
    params = YParams("config/UNet.yaml", "test")  # U-Net base_channels 4, crop 32, batch 4
    params.update({"num_epochs": EPOCHS, "enable_benchy": True})
    return params


@pytest.fixture
def benchy_env(tmp_path, monkeypatch):
    path = tmp_path / "benchy.yaml"
    path.write_text(BENCHY_YAML)
    monkeypatch.setenv("BENCHY_CONFIG_FILE", str(path))
    monkeypatch.delenv("BENCHY_OUTPUT", raising=False)
    monkeypatch.delenv("PEAK_TFLOPS", raising=False)
    return path


def tiny_step(params):
    model = UNet(params.N_in_channels, params.N_out_channels, params.base_channels, params.full_scale)
    optimizer = torch.optim.Adam(model.parameters())

    def step(inputs, targets):
        loss = torch.nn.functional.l1_loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def train_like_train_py(train_loader, step_fn, epochs):
    """train.py's loop, reduced to what benchy sees; returns per epoch (fetches, batches seen).

    The batches are kept, not just their ids: a freed tensor's id can be reused by the next one.
    """
    log = []
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)
        fetched_before = train_loader.loader.fetched
        seen = []
        expected = len(train_loader)  # train.py sizes its loss buffer with it
        for inputs, targets in train_loader:
            step_fn(inputs, targets)
            seen.append(inputs)
        assert len(seen) == expected
        log.append((train_loader.loader.fetched - fetched_before, seen))
        if train_loader.stop_training:
            break
    return log


def test_a_benchy_run_prints_benchys_summary_and_writes_the_json(params, benchy_env, tmp_path, monkeypatch,
                                                                 capsys):
    monkeypatch.setenv("BENCHY_OUTPUT", str(tmp_path / "weak_scale"))
    monkeypatch.setenv("PEAK_TFLOPS", "0.5")  # a CPU has no entry in the table: MFU only when told
    check_benchy_options(params, torch.device("cpu"))
    loader = wrap_for_benchy(CountingLoader(), params, World(), torch.device("cpu"), str(tmp_path / "run"))
    log = train_like_train_py(loader, tiny_step(params), epochs=params.num_epochs + 3)

    assert len(log) == EPOCHS and loader.trials_complete and loader.stop_training
    output = capsys.readouterr().out
    summary = SUMMARY.findall(output)
    assert [kind for kind, _, _ in summary] == ["IO", " SYNTHETIC", "FULL"]
    assert all(float(mean) > 0 and float(std) >= 0 for _, mean, std in summary)
    assert re.search(r"^BENCHY::MFU::FULL model FLOP utilisation: \d+\.\d\d%$", output, re.MULTILINE)

    with open(tmp_path / "weak_scale.json") as f:
        results = json.load(f)
    for kind in ("IO", "SYNTHETIC", "FULL"):
        assert len(results[kind]["trial_throughput"]) == NTRIALS
        assert all(rate > 0 for rate in results[kind]["trial_throughput"])
        assert results["mfu"][kind] == pytest.approx(
            results["flops_per_sample"] * sum(results[kind]["trial_throughput"]) / NTRIALS / 0.5e12)
    assert results["nranks"] == 1 and results["peak_mem_gb"] is None


def test_the_mfus_peak_is_that_of_the_precision_the_convolutions_run_in(params, benchy_env, tmp_path, monkeypatch):
    """float32 with TF32 asked for: the MFU is against the FP32 peak where TF32 does not run, on a CPU and on
    a GPU whose PyTorch and cuDNN turn TF32 off for 3-D convolutions (PyTorch 2.9.1 with cuDNN 9.11:
    utils/conv3d.py's table; the versions are stood in, as this CPU build has no cuDNN), though the
    options alone (utils.flops.precision_of) say TF32; against TF32's where cuDNN runs it (9.16)."""
    monkeypatch.setenv("PEAK_TFLOPS", "1")  # the peak without a GPU to look up: the precision is what differs
    params.update({"amp_mode": "none", "tf32": True})
    assert precision_of(params.amp_mode, params.tf32) == "tf32"

    def precision(device, versions=None):
        if versions:
            monkeypatch.setattr(conv3d, "library_versions", lambda: versions)
        return wrap_for_benchy(CountingLoader(), params, World(), torch.device(device), str(tmp_path)).precision
    assert precision("cpu") == "fp32"
    assert precision("cuda", ("2.9.1+cu130", 91100)) == "fp32"
    assert precision("cuda", ("2.9.1+cu130", 91600)) == "tf32"


def test_trials_use_one_cached_batch_for_synthetic_and_fresh_batches_for_full(params, benchy_env, tmp_path):
    counting = CountingLoader(crop=8)
    loader = wrap_for_benchy(counting, params, World(), torch.device("cpu"), str(tmp_path))
    log = train_like_train_py(loader, lambda inputs, targets: None, epochs=params.num_epochs)

    io_fetches = (NWARMUP + NTRIALS) * NBATCHES  # before the first epoch, nothing handed to training
    synthetic, full = log[:NWARMUP + NTRIALS], log[NWARMUP + NTRIALS:]
    assert synthetic[0][0] == io_fetches + 1
    for fetched, seen in synthetic:  # as benchy: one untimed first step, then nbatches timed ones
        assert len(seen) == NBATCHES + 1 and len({id(batch) for batch in seen}) == 1
    assert all(fetched == 1 for fetched, _ in synthetic[1:])
    for fetched, seen in full:
        assert fetched == NBATCHES and len(seen) == NBATCHES
        assert len({id(batch) for batch in seen}) == NBATCHES


def test_device_is_synchronised_only_at_trial_boundaries(params, benchy_env, tmp_path, monkeypatch):
    syncs = []
    monkeypatch.setattr(BenchyLoader, "synchronize", lambda self: syncs.append(1))
    loader = wrap_for_benchy(CountingLoader(crop=8), params, World(), torch.device("cpu"), str(tmp_path))
    train_like_train_py(loader, lambda inputs, targets: None, epochs=params.num_epochs)
    trials = 3 * (NWARMUP + NTRIALS)
    assert len(syncs) == 2 * trials


def test_without_exit_after_tests_training_goes_on_with_whole_epochs(params, benchy_env, tmp_path):
    benchy_env.write_text(BENCHY_YAML.replace("report_freq: 1", "exit_after_tests: false"))
    counting = CountingLoader(crop=8)
    loader = wrap_for_benchy(counting, params, World(), torch.device("cpu"), str(tmp_path))
    log = train_like_train_py(loader, lambda inputs, targets: None, epochs=EPOCHS + 1)
    assert loader.trials_complete and not loader.stop_training
    assert len(log) == EPOCHS + 1 and len(log[-1][1]) == len(counting)


def test_programmatic_trials_return_throughputs_and_mfu():
    params = YParams("config/UNet.yaml", "test")
    flops, peak = 2.0e9, 1.0e12
    result = run_trials(tiny_step(params), CountingLoader(), torch.device("cpu"), nbatches=NBATCHES,
                        ntrials=NTRIALS, nwarmup=NWARMUP, flops_per_sample=flops, peak_flops=peak)
    for kind in ("io", "synthetic", "full"):
        assert result[kind] > 0 and result["std"][kind] >= 0
        assert result["mfu"][kind] == pytest.approx(flops * result[kind] / peak)
    assert result["peak_mem_gb"] is None  # CPU


def test_programmatic_trials_without_a_peak_report_no_mfu():
    result = run_trials(lambda inputs, targets: None, CountingLoader(crop=8), "cpu", nbatches=2, ntrials=1,
                        nwarmup=0, synthetic=False)
    assert result["synthetic"] is None and result["full"] > 0 and result["io"] > 0
    assert result["mfu"] == {"io": None, "synthetic": None, "full": None}


# ----------------------------------------------------------------------------- configuration

def test_repository_config_is_the_tutorials(monkeypatch):
    monkeypatch.delenv("BENCHY_CONFIG_FILE", raising=False)
    config = load_benchy_config()
    assert [config[s]["nwarmup"] for s in ("IO", "synthetic", "full")] == [3, 3, 3]
    assert config["full"]["nbatches"] == 50 and config["full"]["ntrials"] == 3
    assert benchy.epochs_needed(config) == 12 and benchy.epochs_needed(config, github_benchy=True) == 13


def test_keys_left_out_take_benchys_defaults(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("full:\n  nbatches: 7\n")
    config = load_benchy_config(str(path))
    assert config["full"] == {"run_benchmark": True, "nbatches": 7, "ntrials": 3, "nwarmup": 1}
    assert config["global"]["exit_after_tests"] is True


@pytest.mark.parametrize("text, message", [
    ("full:\n  nbatch: 7\n", "unknown key 'nbatch' in section 'full'. Did you mean 'nbatches'?"),
    ("synthetics:\n  nbatches: 7\n", "unknown section 'synthetics'. Did you mean 'synthetic'?"),
    ("IO:\n  ntrials: 0\n", "IO.ntrials=0"),
    ("global:\n  profiler_mode: some\n", "one of single, all, none"),
    ("full: [1, 2\n", "not valid YAML"),
])
def test_bad_benchy_configs_are_refused(tmp_path, text, message):
    path = tmp_path / "b.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(message)):
        load_benchy_config(str(path))


def test_missing_benchy_config_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHY_CONFIG_FILE", str(tmp_path / "nowhere.yaml"))
    with pytest.raises(UserError, match="does not exist"):
        load_benchy_config()


def test_too_few_epochs_for_the_trials_are_refused(params, benchy_env):
    params.update({"num_epochs": EPOCHS - 1})
    with pytest.raises(UserError, match=f"needs {EPOCHS} epochs.*--num_epochs={EPOCHS}"):
        check_benchy_options(params, torch.device("cpu"))


def test_output_path_follows_benchy_output(monkeypatch):
    config = copy.deepcopy(benchy.DEFAULT_CONFIG)
    monkeypatch.delenv("BENCHY_OUTPUT", raising=False)
    assert benchy.output_path(config, "run") == "run/benchy_result.json"
    monkeypatch.setenv("BENCHY_OUTPUT", "scaling/weak_scale")  # as typed: from the working directory
    assert benchy.output_path(config, "run") == os.path.join(os.getcwd(), "scaling", "weak_scale.json")
    config["global"]["output_dir"] = "/logs"
    assert benchy.output_path(config, "run") == "/logs/scaling/weak_scale.json"


# ----------------------------------------------------------------------------- the GitHub benchy

FAKE_BENCHY = '''
"""A stand-in with the GitHub benchy's wrapper protocol: trials per epoch, then a report."""
import json, os, yaml

class BenchmarkGenericIteratorWrapper:
    def __init__(self, iterator, batch_size):
        with open(os.environ["BENCHY_CONFIG_FILE"]) as f:
            self.benchy_config = yaml.safe_load(f)
        self.iterator, self.batch_size = iterator, batch_size
        self.results = {"nranks": 1, "IO": {"trial_throughput": [10.0, 12.0]}}
        self.trials = sum(self.benchy_config[s]["nwarmup"] + self.benchy_config[s]["ntrials"]
                          for s in ("synthetic", "full"))
        self.calls = 0

    def __iter__(self):
        self.calls += 1
        if self.calls <= self.trials:
            section = self.benchy_config["synthetic"]
            synthetic = self.calls <= section["nwarmup"] + section["ntrials"]
            nbatches = self.benchy_config["synthetic" if synthetic else "full"]["nbatches"]
            batches = iter(self.iterator)
            if synthetic:
                return iter([next(batches)] * (nbatches + 1))
            return (next(batches) for _ in range(nbatches))
        self.results["FULL"] = {"trial_throughput": [4.0, 6.0]}
        glob = self.benchy_config["global"]
        print("BENCHY::SUMMARY::FULL average trial throughput: 5.000 +/- 1.000")
        with open(os.path.join(glob["output_dir"], glob["output_filename"]), "w") as f:
            json.dump(self.results, f)
        return iter(self.iterator)
'''


@pytest.fixture
def fake_benchy(tmp_path, monkeypatch):
    """``benchy.torch`` importable from tmp_path for one test, and forgotten afterwards."""
    package = tmp_path / "fake" / "benchy"
    (package / "torch").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "torch" / "__init__.py").write_text(FAKE_BENCHY)
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    yield
    for name in [name for name in sys.modules if name == "benchy" or name.startswith("benchy.")]:
        del sys.modules[name]


def test_github_benchy_runs_its_own_trials_and_the_run_ends_itself(params, benchy_env, fake_benchy, tmp_path,
                                                                   capsys):
    config = load_benchy_config()
    loader = benchy._GitHubBenchyLoader(
        CountingLoader(crop=8), config, batch_size=4, device="cpu", world_size=1, rank=0,
        flops_per_sample=1e9, peak_flops=1e11, peak_source="test", precision="fp32",
        json_path=str(tmp_path / "out.json"))
    assert loader.wrapper.benchy_config["global"]["exit_after_tests"] is False  # no sys.exit() inside
    assert os.environ["BENCHY_CONFIG_FILE"] == str(benchy_env)  # restored after the wrapper read it
    log = train_like_train_py(loader, lambda inputs, targets: None, epochs=EPOCHS + 5)

    assert len(log) == EPOCHS and loader.stop_training
    output = capsys.readouterr().out
    assert "BENCHY::MFU::FULL model FLOP utilisation: 5.00%" in output
    with open(tmp_path / "out.json") as f:
        results = json.load(f)
    assert results["mfu"]["IO"] == pytest.approx(0.11) and results["mfu"]["FULL"] == pytest.approx(0.05)


def test_github_benchy_is_used_only_on_a_gpu():
    assert not benchy.github_benchy_available(torch.device("cpu"))


def test_trial_plan_is_synthetic_then_full_with_warm_ups_first():
    config = copy.deepcopy(benchy.DEFAULT_CONFIG)
    labels = [label for _, label, _ in benchy.trial_plan(config)]
    assert labels == ["SYNTHETIC_WARMUP_0", "SYNTHETIC_0", "SYNTHETIC_1", "SYNTHETIC_2",
                      "FULL_WARMUP_0", "FULL_0", "FULL_1", "FULL_2"]

