"""benchmarks/scaling_model.py: its arithmetic on cases worked by hand, DDP's buckets against a real DDP,
the gradient timeline against a real backward pass on the CPU, and the check against the original's
published numbers with its tolerance."""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from benchmarks import scaling_model as model
from conftest import ROOT
from networks.UNet import UNet

# A node of 4 GPUs, 100 GB/s within it, 10 GB/s per node between nodes, no latency, no loader bound.
SIMPLE = model.Machine("test", 4, 100.0, 10.0, 0.0, 0.0, None, "hand-made")
FREE = model.Machine("free", 4, float("inf"), float("inf"), 0.0, 0.0, None, "communication costs nothing")


def test_one_gpu_takes_the_compute_time():
    step = model.step_time(SIMPLE, 1, 64, 800.0)
    assert step.step == pytest.approx(64 / 800.0) and step.exposed == 0 and step.samples_per_s == pytest.approx(800)


def test_free_communication_scales_perfectly():
    for row in model.scaling_table(FREE, 64, 800.0):
        assert row["weak_efficiency"] == pytest.approx(1.0) and row["exposed_ms"] == 0
        assert row["strong_efficiency"] in (None, pytest.approx(1.0))


def test_a_ring_moves_2_n_minus_1_over_n_of_the_bytes():
    size = 400e6
    for gpus in (2, 4):  # within a node: NVLink's 100 GB/s
        assert model.allreduce_time(size, gpus, SIMPLE) == pytest.approx(2 * (gpus - 1) / gpus * size / 100e9)
    for gpus in (8, 64):  # across nodes: the nodes' 10 GB/s
        assert model.allreduce_time(size, gpus, SIMPLE) == pytest.approx(2 * (gpus - 1) / gpus * size / 10e9)
    assert model.allreduce_time(size, 1, SIMPLE) == 0


def test_latency_chooses_the_tree_for_many_small_messages():
    slow_hops = dataclasses.replace(FREE, intra_latency=1e-6, inter_latency=10e-6)
    assert model.allreduce_time(1.0, 4, slow_hops) == pytest.approx(2 * 3 * 1e-6)  # ring = tree in a node
    # 256 GPUs on 64 nodes: the ring's 510 hops against the tree's 3 in the node and log2(64) between nodes.
    assert model.allreduce_time(1.0, 256, slow_hops) == pytest.approx(2 * (3 * 1e-6 + 6 * 10e-6))
    per_call = dataclasses.replace(slow_hops, call_latency=8e-6)  # once per all-reduce, whatever the size
    assert model.allreduce_time(1.0, 256, per_call) == pytest.approx(8e-6 + 2 * (3 * 1e-6 + 6 * 10e-6))


def test_overlap_hides_what_is_ready_early():
    """Two buckets by hand: one ready at the end of the backward pass cannot hide; one ready at
    its start hides behind the rest of it."""
    network = model.Network((model.Gradient("a", 100 * model.MIB, 0.0),), 0.5, 0)
    late = dataclasses.replace(network, gradients=(model.Gradient("a", 100 * model.MIB, 1.0),))
    compute = 64 / 4000.0
    transfer = model.allreduce_time(100 * model.MIB, 8, SIMPLE)
    assert transfer > compute / 2  # longer than the backward pass: part shows even when ready first
    early = model.step_time(SIMPLE, 8, 64, 4000.0, network, bucket_cap_mb=100)
    assert early.exposed == pytest.approx(transfer - compute / 2)
    assert model.step_time(SIMPLE, 8, 64, 4000.0, late, bucket_cap_mb=100).exposed == pytest.approx(transfer)


def test_bf16_hook_halves_the_bytes():
    doubled = dataclasses.replace(SIMPLE, nvlink_bw=200.0, node_network_bw=20.0)
    for gpus in (4, 32):
        half = model.step_time(SIMPLE, gpus, 16, 500.0, ddp_comm_hook="bf16")
        assert half.exposed == pytest.approx(model.step_time(doubled, gpus, 16, 500.0).exposed)
        assert half.exposed < model.step_time(SIMPLE, gpus, 16, 500.0).exposed


def test_the_loader_bounds_the_step():
    slow_loader = dataclasses.replace(FREE, loader_rate=400.0)
    assert model.step_time(slow_loader, 8, 64, 800.0).samples_per_s == pytest.approx(8 * 400.0)


def test_unet_gradients_and_buckets_are_the_original_ones():
    """117 M parameters (468 MB of fp32 gradients); DDP's assignment with the original's 1 MiB first
    bucket gives the 8 NCCL calls per step it counted at 25 MB and the 5 at 100 MB."""
    network = model.unet()
    assert sum(g.bytes for g in network.gradients) == pytest.approx(468e6, rel=0.001)
    assert network.buffer_bytes == 0  # nothing for broadcast_buffers to send
    assert network.forward_share == pytest.approx(27.2 / 80.5, abs=0.002)  # REFERENCE.md's FLOPs
    assert len(model.buckets(network, 25)) == 8 and len(model.buckets(network, 100)) == 5
    assert [round(size / model.MIB) for size, _ in model.buckets(network, 100, first_bucket_mb=100)] == \
        [212, 128, 104, 2]  # torch 2.13 with an explicit bucket_cap_mb: no 1 MiB first bucket
    assert len(model.buckets(network, 25, first_bucket_mb=25)) == 7
    readies = [g.ready for g in network.gradients]
    assert readies == sorted(readies) and readies[-1] == pytest.approx(1.0)


def test_the_gradient_timeline_is_that_of_a_real_backward_pass_on_the_cpu():
    """The meta device records what a real CPU backward pass does: the same order and FLOP shares."""
    torch.manual_seed(0)
    cpu = model.record_gradients(UNet(4, 5, 4, False), torch.randn(1, 4, 32, 32, 32))
    with torch.device("meta"):
        meta = model.record_gradients(UNet(4, 5, 4, False), torch.empty(1, 4, 32, 32, 32))
    assert cpu == meta
    assert [g.name for g in cpu.gradients][:2] == ["last.weight", "last.bias"]  # the output layer's first


def test_the_broadcast_costs_only_where_there_are_buffers():
    with torch.device("meta"):
        network = model.record_gradients(torch.nn.Sequential(torch.nn.Conv3d(4, 8, 3), torch.nn.BatchNorm3d(8)),
                                         torch.empty(2, 4, 8, 8, 8))
    assert network.buffer_bytes > 0
    on = model.step_time(SIMPLE, 8, 16, 500.0, network)
    assert on.broadcast > 0 and model.step_time(SIMPLE, 8, 16, 500.0, network, broadcast_buffers=False).broadcast == 0
    assert model.step_time(SIMPLE, 8, 16, 500.0).broadcast == 0  # the U-Net: DDP skips the call


DDP_BUCKETS = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from networks.UNet import UNet
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
    counts = {}
    for cap in (1, 2):
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(UNet(4, 5, 8, False), bucket_cap_mb=cap)
        calls = []
        ddp.register_comm_hook(None, lambda state, bucket: calls.append(1)
                               or default_hooks.allreduce_hook(None, bucket))
        for _ in range(2):  # DDP rebuilds its buckets in the order of the first backward pass
            calls.clear()
            ddp(torch.randn(1, 4, 32, 32, 32)).sum().backward()
        counts[cap] = len(calls)
    print(json.dumps(counts))
""")


def test_the_buckets_are_those_of_a_real_ddp():
    """A real DDP (one gloo rank) on a small U-Net (4 MiB of gradients) counts its all-reduces with a
    comm hook; the model's assignment, with this torch's first bucket, predicts each count."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run([sys.executable, "-c", DDP_BUCKETS, str(port)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    counts = {int(cap): n for cap, n in json.loads(result.stdout.splitlines()[-1]).items()}
    network = model.unet(8, False, 32)
    predicted = {cap: len(model.buckets(network, cap, model.first_bucket_mb_of_this_torch(cap))) for cap in counts}
    assert counts == predicted and len(set(counts.values())) > 1


def test_the_published_numbers_within_their_tolerance():
    fit = model.fit_published()
    assert [row["term"].split(":")[0] for row in fit["rows"]] == ["fitted", "predicted", "fitted", "predicted"]
    for row in fit["rows"]:
        assert abs(row["error"]) <= row["tolerance"], row
    assert 0 < fit["network_share"] < 1 and 300 < fit["rate_16"] < 782  # a small batch uses an A100 less well


def test_the_committed_report_is_what_the_model_computes(tmp_path):
    """benchmarks/results/scaling_model/ (what the README quotes) is up to date with the code."""
    fresh = model.report(str(tmp_path))
    folder = os.path.join(ROOT, "benchmarks", "results", "scaling_model")
    with open(os.path.join(folder, "report.json")) as f:
        committed = json.load(f)
    assert committed["check"] == [{**row, "predicted": pytest.approx(row["predicted"]),
                                   "error": pytest.approx(row["error"], abs=1e-9)} for row in fresh["check"]]
    names = sorted(name for name in os.listdir(folder) if name.endswith(".md"))
    assert names == sorted(p.name for p in tmp_path.glob("*.md")) and "check.md" in names
    for name in names:  # every rounded number the same
        with open(os.path.join(folder, name)) as f:
            assert (tmp_path / name).read_text() == f.read(), name


def test_knobs_ranked_at_32_nodes():
    machine, _ = model.resolve_machine("perlmutter", "fitted")
    ranked = dict(model.rank_knobs(machine, model.ONE_GPU_RATE["perlmutter"], combinations=False))
    assert ranked["bs64_opt as published (the baseline)"] == pytest.approx(0.78, abs=0.001)  # the fit
    assert ranked["--disable_broadcast_buffers"] == ranked["bs64_opt as published (the baseline)"]  # no buffers
    assert ranked["--ddp_comm_hook=bf16"] > 0.92 and ranked["--local_batch_size=128"] > 0.92


def test_command_line_prints_a_table(capsys, tmp_path):
    model.main(["--machine", "h100", "--local_batch_size=128", "--ddp_comm_hook=bf16",
                "--out", str(tmp_path / "p.png")])
    out = capsys.readouterr().out
    assert "| 1024 | 128 |" in out and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_cpu_prediction_of_two_ranks_is_within_its_tolerance():
    """The demo model's 2-rank step, predicted from its 1-rank step and the measured gloo profiles,
    against the 2-rank step measured the same day (within the 10% that two launches differ by)."""
    check = model.cpu_check()
    measured, *predicted = check["rows"]
    assert measured["label"] == "measured" and len(predicted) == 2
    for row in predicted:
        assert row["exposed_ms"] > 0 and abs(row["error"]) < 0.10, row
