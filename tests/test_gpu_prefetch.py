"""The device prefetcher and gradient accumulation on a GPU: the copy of batch k+1 overlaps step k (CUDA
events on both streams), the batches are the host loader's, the hand-over never makes the host wait,
and train.py trains alike with the prefetcher on and off, and with K micro-batches (channels_last and
bf16 AMP on). Skipped without a GPU; benchmarks/suite/gpu_suite.sh runs them (-m gpu). tests/test_prefetch.py
and tests/test_accumulation.py check the same logic on the CPU."""
import functools

import pytest
import torch

import dist_worker
import train
from conftest import needs_cuda, run_train
from test_distributed import assert_matches_reference
from test_gpu_paths import gpu_args, scalars
from utils import get_data_loader_distributed
from utils.YParams import YParams
from utils.distributed import World
from utils.prefetch import DevicePrefetcher, device_prefetcher

pytestmark = [pytest.mark.slow]


def cuda():
    return torch.device("cuda", torch.cuda.current_device())


def pinned_batches(count, megabytes):
    """``count`` batches (inputs, targets) of about ``megabytes`` each, in pinned host memory, as the
    host loaders make them on a GPU."""
    side = 64
    samples = max(1, int(megabytes * 2**20 / (9 * side**3 * 4)))
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(samples, 4, side, side, side, generator=generator).pin_memory(),
             torch.randn(samples, 5, side, side, side, generator=generator).pin_memory()) for _ in range(count)]


class ListLoader(list):
    """A list of batches with the length the prefetcher reports."""


def loader_and_prefetcher(data_files, memory_format, **options):
    """(the training loader on the GPU, train.py's move in ``memory_format``, the prefetcher over the loader)."""
    params = YParams("config/UNet.yaml", "test")
    params.update({"train_path": data_files["train"], "val_path": data_files["valid"], **options})
    device = cuda()
    train_loader, _ = get_data_loader_distributed(params, 0, device)
    move = functools.partial(train.to_device, device=device, memory_format=memory_format)
    prefetcher = device_prefetcher(train_loader, params, device, move)
    assert isinstance(prefetcher, DevicePrefetcher)
    return train_loader, move, prefetcher


@needs_cuda()
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d])
def test_prefetched_batches_are_the_host_loaders(data_files, memory_format):
    train_loader, move, prefetcher = loader_and_prefetcher(data_files, memory_format, data_loader_config="lowmem",
                                                           num_data_workers=2, device_prefetch=True)
    device = cuda()
    train_loader.sampler.set_epoch(1)
    expected = [tuple(move(t) for t in batch) for batch in train_loader]
    prefetcher.sampler.set_epoch(1)
    actual = list(prefetcher)
    assert len(actual) == len(expected) == len(train_loader)
    for got, want in zip(actual, expected):
        for a, b in zip(got, want):
            assert a.device == device and a.is_contiguous(memory_format=memory_format)
            assert torch.equal(a, b)


@needs_cuda()
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d])
def test_the_gpu_resident_loaders_side_stream_gather_gives_its_batches_without_a_host_wait(data_files, memory_format):
    """--side_stream_gather: the crops of batch k+1 are cut on the side stream; the batches are those of the
    loader iterated on the compute stream, and no batch makes the host wait."""
    train_loader, move, prefetcher = loader_and_prefetcher(
        data_files, memory_format, data_loader_config="gpu-inmem", side_stream_gather=True,
        channels_last=memory_format == torch.channels_last_3d)
    train_loader.sampler.set_epoch(1)
    expected = [tuple(move(t).clone() for t in batch) for batch in train_loader]
    prefetcher.sampler.set_epoch(1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        actual = [tuple(t.clone() for t in batch) for batch in prefetcher]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(actual) == len(expected) == len(train_loader) > 1
    for got, want in zip(actual, expected):
        for a, b in zip(got, want):
            assert a.is_contiguous(memory_format=memory_format) and torch.equal(a, b)


@needs_cuda()
def test_the_hand_over_never_makes_the_host_wait():
    device = cuda()
    batches = ListLoader(pinned_batches(4, 16))
    prefetcher = DevicePrefetcher(batches, functools.partial(train.to_device, device=device,
                                                             memory_format=torch.channels_last_3d), device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sums = [inputs.sum() + targets.sum() for inputs, targets in prefetcher]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for total, (inputs, targets) in zip(sums, batches):
        torch.testing.assert_close(total.cpu(), inputs.sum() + targets.sum(), rtol=1e-4, atol=1e-2)


def sleep_cycles_for(milliseconds):
    """GPU clock cycles that torch.cuda._sleep spins for about ``milliseconds`` (measured here)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * milliseconds / start.elapsed_time(end))


@needs_cuda()
def test_the_copy_of_the_next_batch_overlaps_the_step():
    """Each step spins 50 ms on the compute stream and reads its batch. With the prefetcher every copy
    runs on the copy stream and ends before the step ahead of its batch ends, and the compute stream
    goes from one step to the next without a gap; without it, each copy sits on the compute stream
    between two steps (the gap the prefetcher closes)."""
    device = cuda()
    cycles = sleep_cycles_for(50)

    def timed_move(log, tensor):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        copy = train.to_device(tensor, device, torch.contiguous_format)
        end.record()
        log.append((start, end, torch.cuda.current_stream(device)))
        return copy

    def run(prefetch):
        copies, steps = [], []
        batches = ListLoader(pinned_batches(5, 32))
        move = functools.partial(timed_move, copies)
        loader = DevicePrefetcher(batches, move, device) if prefetch else ([move(t) for t in b] for b in batches)
        for inputs, targets in loader:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            inputs.mul_(2), targets.mul_(2)  # the step reads and writes its batch
            end.record()
            steps.append((start, end))
        torch.cuda.synchronize()
        batch_copies = [(copies[i][0], copies[i + 1][1], copies[i][2]) for i in range(0, len(copies), 2)]
        gaps = [steps[k][1].elapsed_time(steps[k + 1][0]) for k in range(len(steps) - 1)]
        return batch_copies, steps, gaps

    copies, steps, gaps = run(prefetch=True)
    copy_ms = sum(start.elapsed_time(end) for start, end, _ in copies) / len(copies)
    compute = torch.cuda.current_stream(device)
    assert all(stream != compute for _, _, stream in copies)
    for k in range(len(steps) - 1):
        _, copy_end, _ = copies[k + 1]
        assert steps[0][0].elapsed_time(copy_end) > 0, f"batch {k + 1} copied before the steps began"
        assert copy_end.elapsed_time(steps[k][1]) > 0, f"batch {k + 1}'s copy did not end during step {k}"
    assert max(gaps) < copy_ms / 2, (gaps, copy_ms)

    copies, steps, gaps = run(prefetch=False)
    for k in range(len(steps) - 1):
        assert copies[k + 1][1].elapsed_time(steps[k][1]) < 0, f"without the prefetcher batch {k + 1} is " \
                                                                f"copied after step {k}"
    assert min(gaps) > copy_ms / 2, (gaps, copy_ms)


@needs_cuda()
def test_train_py_trains_alike_with_the_prefetcher_on_and_off_and_with_micro_batches(data_files, tmp_path):
    """Deterministic cuDNN, channels_last, bf16: bit-equal losses with and without the prefetcher; with
    --grad_accum_steps=2 the same steps, and losses within bf16's rounding."""
    common = ["--deterministic", "--channels_last", "--amp_mode=bf16", "--num_epochs=2"]
    losses = {}
    for name, extra in (("on", ["--device_prefetch=true"]), ("off", ["--device_prefetch=false"]),
                        ("k2", ["--device_prefetch=true", "--grad_accum_steps=2"])):
        run_train(gpu_args(data_files, tmp_path, f"--run_num={name}", *common, *extra))
        run_dir = tmp_path / "test" / "1GPU" / name
        losses[name] = scalars(run_dir, "Loss/train") + scalars(run_dir, "Loss/valid")
    assert losses["on"] == losses["off"]
    assert len(losses["k2"]) == len(losses["on"])
    assert losses["k2"] == pytest.approx(losses["on"], rel=5e-2)


@needs_cuda()
def test_k_micro_batches_train_as_one_batch_on_cuda():
    """tests/test_accumulation.py's float64 comparison, on the GPU (deterministic cuDNN)."""
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    device = cuda()
    one = dist_worker.train_accumulating(dist_worker.make_params(grad_accum_steps=1), World(), device)
    two = dist_worker.train_accumulating(dist_worker.make_params(grad_accum_steps=2), World(), device)
    to_cpu = lambda result: {key: ({k: v.cpu() for k, v in value.items()} if key in ("grads", "weights") else value)  # noqa: E731
                             for key, value in result.items()}
    assert_matches_reference(to_cpu(two), to_cpu(one))
