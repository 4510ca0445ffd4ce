"""benchmarks/allreduce.py: nccl-tests' bandwidths worked by hand, the profile's fit and keys, and the
sweep itself on two real gloo ranks (tests/test_slurm.py runs it between two Slurm nodes)."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks import allreduce
from conftest import ROOT, timeout_for


def test_sizes_run_from_one_mib_to_one_gib_by_factors_of_two():
    assert allreduce.parse_bytes("1M") == 2**20 and allreduce.parse_bytes("1G") == 2**30
    assert allreduce.parse_bytes("64K") == 65536 and allreduce.parse_bytes("4096") == 4096
    default = allreduce.sizes(allreduce.parse_bytes("1M"), allreduce.parse_bytes("1G"))
    assert default == [2**k for k in range(20, 31)]
    with pytest.raises(Exception):
        allreduce.parse_bytes("1 gigabyte")


@pytest.mark.parametrize("ranks, factor", [(2, 1.0), (3, 4 / 3), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_is_nccl_tests_all_reduce_factor(ranks, factor):
    """1 GB in 10 ms: algbw 100 GB/s; busbw = algbw x 2 (n - 1) / n (nccl-tests' doc/PERFORMANCE.md)."""
    r = allreduce.row(10**9, 0.01, ranks)
    assert r["time_us"] == pytest.approx(1e4) and r["algbw_GBps"] == pytest.approx(100)
    assert r["busbw_GBps"] == pytest.approx(100 * factor)


def rows_of(latency_us, busbw_GBps, ranks, sizes):
    """Rows of a network that follows time = latency + bytes x 2 (n - 1) / n / busbw exactly."""
    factor = allreduce.bus_factor(ranks)
    return [allreduce.row(size, 1e-6 * latency_us + size * factor / (busbw_GBps * 1e9), ranks) for size in sizes]


def test_profile_recovers_the_latency_and_the_bus_bandwidth():
    sizes = allreduce.sizes(2**20, 2**30)
    profile = allreduce.profile("nccl", 8, 1, rows_of(25.0, 200.0, 8, sizes))
    assert tuple(profile) == allreduce.KEYS and allreduce.check_profile(profile) is profile
    assert profile["latency_us"] == pytest.approx(25.0, rel=1e-6)
    # The largest message's bus bandwidth: the latency still costs it a little.
    transfer = 2**30 * 1.75 / 200e9
    largest = 200 * transfer / (25e-6 + transfer)
    assert profile["busbw_GBps"] == pytest.approx(largest) and 199 < profile["busbw_GBps"] < 200
    # A noisy small size (four times its time) moves the fitted latency, but stays in the right range.
    noisy = rows_of(25.0, 200.0, 8, sizes)
    noisy[0] = allreduce.row(2**20, 4 * noisy[0]["time_us"] * 1e-6, 8)
    assert 25 < allreduce.fit_latency(noisy) < 4 * noisy[0]["time_us"]
    # Times that grow faster than the size leave no latency to fit: 0, not a negative time.
    assert allreduce.fit_latency([allreduce.row(2**20, 1e-4, 2), allreduce.row(2**21, 1e-3, 2)]) == 0.0


def test_check_profile_refuses_other_keys():
    profile = allreduce.profile("gloo", 2, 1, rows_of(100.0, 1.0, 2, [2**20, 2**21]))
    with pytest.raises(ValueError):
        allreduce.check_profile({**profile, "name": "extra"})
    with pytest.raises(ValueError):
        allreduce.check_profile({**profile, "rows": [{"bytes": 1, "seconds": 1.0}]})


def torchrun(*args, ranks=2):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "-m", "benchmarks.allreduce", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(300),
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_two_gloo_ranks_write_the_profile_and_keep_an_earlier_one(tmp_path):
    out = tmp_path / "cpu.json"
    result = torchrun("--min_bytes", "64K", "--max_bytes", "1M", "--iters", "3", "--warmup", "1", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    profile = allreduce.check_profile(json.loads(out.read_text()))
    assert (profile["backend"], profile["world_size"], profile["nodes"]) == ("gloo", 2, 1)
    assert [r["bytes"] for r in profile["rows"]] == [65536, 131072, 262144, 524288, 1048576]
    for r in profile["rows"]:
        assert r["time_us"] > 0 and r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2 (n - 1) / n = 1 on two ranks
    assert profile["busbw_GBps"] == profile["rows"][-1]["busbw_GBps"] and profile["latency_us"] >= 0
    lines = [line.split() for line in result.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert [int(line[0]) for line in lines] == [r["bytes"] for r in profile["rows"]]  # one printed line a size
    # Run again onto the same file: refused before measuring, the profile kept.
    kept = out.read_text()
    again = torchrun("--min_bytes", "64K", "--max_bytes", "64K", "--out", str(out))
    assert again.returncode != 0 and "already holds cpu.json" in " ".join(again.stderr.split())
    assert out.read_text() == kept


def test_outside_a_launcher_it_says_how_to_launch(capsys):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    result = subprocess.run([sys.executable, "-m", "benchmarks.allreduce"], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_for(120), env=env)
    assert result.returncode == 2 and "launch it with torchrun" in result.stderr
