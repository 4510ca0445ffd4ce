"""The device prefetcher (utils/prefetch.py) without a GPU: the batches of the three host loaders, equal
and in order with it on and off, and its stream logic, run against a stand-in for ``torch.cuda`` that
keeps the order of the work queued on each stream and of the waits between streams. The same class
runs on CUDA in tests/test_gpu_prefetch.py."""
import contextlib
import functools

import pytest
import torch

import train
from utils import get_data_loader_distributed
from utils.YParams import YParams
from utils.prefetch import DevicePrefetcher, device_prefetcher


class QueuedStream:
    """A stream as an ordered list of the work queued on it, and the events it waited for."""

    def __init__(self, name):
        self.name, self.work, self.waited = name, [], []

    def wait_event(self, event):
        self.waited.append(event)

    def wait_stream(self, stream):
        """Work queued from now on starts after all of ``stream``'s work so far."""
        everything = QueuedEvent()
        everything.record(stream)
        self.wait_event(everything)

    def has_waited_for(self, stream, position):
        """Whether work queued from now on starts after ``stream``'s work up to ``position``."""
        return any(event.stream is stream and event.position > position for event in self.waited)


class QueuedEvent:
    def __init__(self):
        self.stream = self.position = None

    def record(self, stream):
        self.stream, self.position = stream, len(stream.work)  # marks all the work queued so far


class StreamsStandIn:
    """``torch.cuda``'s stream interface as the prefetcher uses it: Stream, Event, stream(), current_stream()."""

    def __init__(self):
        self.compute = QueuedStream("compute")
        self.current = self.compute
        self.made = []

    def Stream(self, device):  # noqa: N802 - torch.cuda's name
        stream = QueuedStream(f"side {len(self.made)}")
        self.made.append(stream)
        return stream

    def Event(self):  # noqa: N802
        return QueuedEvent()

    @contextlib.contextmanager
    def stream(self, stream):
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def current_stream(self, device=None):
        return self.current


class CopiedTensor(torch.Tensor):
    """A batch tensor as the stand-in's copy makes it: it knows the stream and the place in its queue
    where it was copied, and the streams it was recorded on."""

    def record_stream(self, stream):
        self.recorded_on.append(stream)


def queued_copy(streams, memory_format, tensor):
    """train.py's ``to_device`` on the CPU, queued as work on the current stream of ``streams``."""
    copy = train.to_device(tensor, torch.device("cpu"), memory_format).clone(memory_format=memory_format)
    copy = copy.as_subclass(CopiedTensor)
    copy.stream, copy.position, copy.recorded_on = streams.current, len(streams.current.work), []
    streams.current.work.append(copy)
    return copy


def make_params(data_files, kind, **changes):
    params = YParams("config/UNet.yaml", "test")
    params.update({"train_path": data_files["train"], "val_path": data_files["valid"], "data_loader_config": kind,
                   "num_data_workers": 1, "Nsamples": 12, "Nsamples_val": 6, "global_batch_size": 4, **changes})
    return params


def host_loaders(params):
    return get_data_loader_distributed(params, 0, torch.device("cpu"))


def prefetched(loader, streams, memory_format=torch.contiguous_format):
    return DevicePrefetcher(loader, functools.partial(queued_copy, streams, memory_format), torch.device("cpu"),
                            streams)


def plain(tensor):
    return tensor.as_subclass(torch.Tensor)


def check_safe_hand_over(batches, streams):
    """Consume ``batches`` (from a prefetcher on ``streams``) as the training loop does, checking each
    batch at the moment it is handed out; return the batches, as plain tensors."""
    compute, seen = streams.compute, []
    for index, batch in enumerate(batches):
        for tensor in batch:
            assert tensor.stream is not compute, "copied on the compute stream: nothing can overlap"
            assert compute.has_waited_for(tensor.stream, tensor.position), \
                f"batch {index} handed out before the compute stream waited for its copy's event"
            assert compute in tensor.recorded_on, "not recorded on the compute stream: its memory may be reused early"
        copy_stream = batch[0].stream
        if index + 1 < len(batches.loader):
            # Batch k+1's copy is queued before batch k is handed out, and the compute stream has not
            # waited for it: it runs while step k computes.
            assert len(copy_stream.work) == 2 * (index + 2), f"batch {index + 1}'s copy not queued ahead"
            assert not compute.has_waited_for(copy_stream, 2 * (index + 1)), \
                f"the compute stream waits for batch {index + 1} before step {index}: no overlap"
        seen.append(tuple(plain(tensor) for tensor in batch))
    return seen


def assert_same_batches(actual, expected):
    assert len(actual) == len(expected) > 0
    for got, want in zip(actual, expected):
        assert len(got) == len(want) == 2
        for a, b in zip(got, want):
            assert torch.equal(a, b) and a.dtype == b.dtype


@pytest.mark.parametrize("kind", ["lowmem", "inmem", "synthetic"])
def test_host_loader_batches_are_equal_and_in_order_with_and_without_the_prefetcher(data_files, kind):
    params = make_params(data_files, kind)
    for loader in host_loaders(params):
        loader.sampler.set_epoch(3)
        expected = list(loader)
        streams = StreamsStandIn()
        loader.sampler.set_epoch(3)
        actual = check_safe_hand_over(prefetched(loader, streams), streams)
        assert_same_batches(actual, expected)
        assert len(streams.made) == 1 and streams.current is streams.compute


def test_channels_last_is_made_on_the_copy_stream(data_files):
    train_loader, _ = host_loaders(make_params(data_files, "inmem"))
    train_loader.sampler.set_epoch(0)
    expected = list(train_loader)
    streams = StreamsStandIn()
    train_loader.sampler.set_epoch(0)
    batches = list(prefetched(train_loader, streams, torch.channels_last_3d))
    assert_same_batches([tuple(plain(t) for t in batch) for batch in batches], expected)
    for batch in batches:
        assert all(t.is_contiguous(memory_format=torch.channels_last_3d) and t.stream is streams.made[0]
                   for t in batch)


def test_resumed_epoch_and_loader_attributes_pass_through(data_files):
    """train.py sets the sampler's epoch and start, and reads the loader's length and batch size."""
    train_loader, _ = host_loaders(make_params(data_files, "inmem"))
    streams = StreamsStandIn()
    loader = prefetched(train_loader, streams)
    assert len(loader) == len(train_loader) == 3 and loader.batch_size == 4
    loader.sampler.set_epoch(2, start=4)  # the prefetcher's sampler is the loader's
    resumed = [tuple(plain(t) for t in batch) for batch in loader]
    train_loader.sampler.set_epoch(2)
    assert_same_batches(resumed, list(train_loader)[1:])


class HandsOutBeforeTheWait(DevicePrefetcher):
    """Wrong on purpose: waits for the copy only after the batch was handed out."""

    def __iter__(self):
        for tensors, copied in map(self.start_copy, self.loader):
            yield tensors
            self.hand_over(tensors, copied)


class WaitsForTheWholeCopyStream(DevicePrefetcher):
    """Wrong on purpose: ``wait_stream(copy_stream)`` at hand-over, which also waits for the next batch's
    copy queued behind it. Safe, but step k then starts only after batch k+1 arrived: no overlap."""

    def hand_over(self, tensors, copied):
        everything = self.streams.Event()
        everything.record(self.copy_stream)
        return super().hand_over(tensors, everything)


class ForgetsRecordStream(DevicePrefetcher):
    """Wrong on purpose: the caching allocator may reuse a batch's memory while the step reads it."""

    def hand_over(self, tensors, copied):
        self.streams.current_stream(self.device).wait_event(copied)
        return tensors


@pytest.mark.parametrize("broken, fragment", [(HandsOutBeforeTheWait, "before the compute stream waited"),
                                              (WaitsForTheWholeCopyStream, "no overlap"),
                                              (ForgetsRecordStream, "not recorded")])
def test_the_hand_over_check_fails_on_a_wrong_prefetcher(data_files, broken, fragment):
    train_loader, _ = host_loaders(make_params(data_files, "inmem"))
    streams = StreamsStandIn()
    loader = broken(train_loader, functools.partial(queued_copy, streams, torch.contiguous_format),
                    torch.device("cpu"), streams)
    with pytest.raises(AssertionError, match=fragment):
        check_safe_hand_over(loader, streams)


@pytest.mark.parametrize("kind, device, prefetch, gather, wrapped", [
    ("lowmem", "cuda", True, False, True), ("inmem", "cuda", True, False, True),
    ("synthetic", "cuda", True, False, True), ("lowmem", "cuda", False, False, False),
    ("lowmem", "cpu", True, False, False), ("gpu-inmem", "cuda", True, False, False),
    ("dali-lowmem", "cuda", True, True, False),
    # --side_stream_gather: the GPU-resident loader's gather on the side stream, on a GPU only
    ("gpu-inmem", "cuda", False, True, True), ("gpu-inmem", "cpu", True, True, False),
    ("lowmem", "cuda", False, True, False)])
def test_prefetch_only_where_a_host_loader_feeds_a_gpu_or_the_gather_is_asked_to_overlap(kind, device, prefetch,
                                                                                         gather, wrapped):
    params = YParams("config/UNet.yaml", "test")
    params.update({"data_loader_config": kind, "device_prefetch": prefetch, "side_stream_gather": gather})
    loader = object()
    result = device_prefetcher(loader, params, torch.device(device), move=None, streams=StreamsStandIn())
    assert isinstance(result, DevicePrefetcher) if wrapped else result is loader


def test_prefetch_is_on_by_default_and_can_be_turned_off_from_the_command_line():
    from utils.YParams import load_params
    assert load_params(["--config=base"]).device_prefetch is True
    assert load_params(["--config=base", "--device_prefetch=false"]).device_prefetch is False
    assert load_params(["--config=base"]).side_stream_gather is False  # to be measured on a GPU first (the ladder)


def test_the_gather_of_batch_k_plus_1_runs_on_the_side_stream_after_the_compute_streams_work(data_files):
    """--side_stream_gather: the GPU-resident loader (here on CPU tensors) is iterated under the copy
    stream, which first waits for the compute stream (the volumes, the draws); the batches are the
    same, in the same order, and handed over as the host loaders' are."""
    params = make_params(data_files, "gpu-inmem", side_stream_gather=True)
    expected = [tuple(batch) for batch in host_loaders(params)[0]]
    train_loader, _ = host_loaders(params)
    streams = StreamsStandIn()
    gathered_on = []
    augment = train_loader.augment

    def recording(*args):
        gathered_on.append(streams.current)
        return augment(*args)

    train_loader.augment = recording
    streams.compute.work.append("the volumes' upload")
    batches = prefetched(train_loader, streams)
    assert_same_batches(check_safe_hand_over(batches, streams), expected)
    [side] = streams.made
    assert gathered_on == [side] * len(expected)
    assert side.has_waited_for(streams.compute, 0), "the side stream did not wait for the compute stream's work"
