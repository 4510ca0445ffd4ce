"""The device prefetcher: batch k+1 is copied to the GPU on a side stream while step k computes.

Without it, train.py copies each batch of a host loader (``lowmem``, ``inmem``, ``synthetic``) at the
start of its step, on the compute stream. From pinned memory with ``non_blocking=True`` the host does
not wait for that copy, but the GPU does: the copy runs between the last step's kernels and this
step's forward (a 64-sample batch of 64^3 crops is 604 MB, about 25 ms over PCIe 4). The prefetcher
moves the copy off the critical path:

    batch k+1 from the loader -> copy on the copy stream, record an event after it
    hand out batch k: the compute stream waits for batch k's event (on the GPU; the host goes on)

The pieces, and why each is needed:

* pinned buffers: the host loaders pin their batches on a GPU (``pin_memory=True``), so the copy is
  a DMA transfer that runs while the GPU computes, and the host does not wait for it;
* a second CUDA stream for the copies: kernels and copies on different streams may overlap;
* one event per batch, recorded after its copy: the compute stream waits for exactly that batch
  (``wait_event``). ``compute.wait_stream(copy_stream)`` would also wait for the next batch's copy,
  already queued behind it, and serialise the two again;
* ``record_stream``: the batch's memory was allocated on the copy stream, so the caching allocator
  would otherwise hand it out again as soon as Python drops the tensor, while the compute stream may
  still be reading it. Recording the compute stream makes the allocator wait for that stream's work.

The layout conversion (``channels_last``) happens on the copy stream too, inside the same ``move``
that train.py uses without a prefetcher: it is a device-side transpose that would otherwise sit on
the compute stream before the forward; on the copy stream it overlaps with the previous step.

The loader itself is iterated under the copy stream too. For a host loader that changes nothing (its
work is on the host). For the GPU-resident loader (``gpu-inmem``), whose batch is a gather on the
device, ``--side_stream_gather`` wraps it the same way: batch k+1's crops are cut on the side stream
while step k computes, where without it the gather runs on the compute stream between two steps.
At the start of each pass the side stream waits for the compute stream's work so far (the uploaded
volumes, the epoch's draws).

Everything downstream sees ordinary device tensors: AMP casts inside the step, the domain mesh's
loaders already yield this rank's blocks, DDP and FSDP see the same batches, and train_graph.py
copies them into its static input tensors after the wait. On the CPU, and for ``dali-lowmem``
(whose pipeline has its own streams), there is nothing to overlap and :func:`device_prefetcher`
returns the loader unchanged, as for ``gpu-inmem`` without ``--side_stream_gather``.
"""
import torch

from utils import NATIVE_LOADERS


def device_prefetcher(loader, params, device, move, streams=torch.cuda):
    """``loader`` with its batches made ahead by a :class:`DevicePrefetcher` on a side stream: a host loader's
    copied (``--device_prefetch``), the GPU-resident loader's gathered (``--side_stream_gather``); or
    ``loader`` itself where there is nothing to overlap (a CPU run, DALI, either switch off)."""
    host = params.device_prefetch and params.data_loader_config in NATIVE_LOADERS
    gather = params.side_stream_gather and params.data_loader_config == "gpu-inmem"
    if device.type != "cuda" or not (host or gather):
        return loader
    return DevicePrefetcher(loader, move, device, streams)


class DevicePrefetcher:
    """Iterates ``loader`` and yields its batches on the device, one batch ahead.

    ``move(tensor)`` copies one host tensor to the device (train.py's ``to_device``: non-blocking,
    in the model's memory format); it runs under the copy stream. ``streams`` is the module that
    provides ``Stream``, ``Event``, ``stream`` and ``current_stream``: ``torch.cuda``, or a
    stand-in with the same interface where the stream logic is tested without a GPU.
    Anything else (``len``, ``sampler``, ``batch_size``, ...) is the loader's.
    """

    def __init__(self, loader, move, device, streams=torch.cuda):
        self.loader, self.move, self.device, self.streams = loader, move, device, streams
        self.copy_stream = streams.Stream(device)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):  # only for what this class does not define itself
        if name == "loader":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self):
        ahead, batches = None, self.batches()
        for batch in batches:
            copying = self.start_copy(batch)  # batch k+1 goes on its way ...
            if ahead is not None:
                yield self.hand_over(*ahead)  # ... while step k runs
            ahead = copying
        if ahead is not None:
            yield self.hand_over(*ahead)

    def batches(self):
        """The loader's batches, each made under the copy stream (a device loader's gather runs there),
        which first waits for what the compute stream has queued so far."""
        self.copy_stream.wait_stream(self.streams.current_stream(self.device))
        iterator = iter(self.loader)
        while True:
            with self.streams.stream(self.copy_stream):
                batch = next(iterator, None)
            if batch is None:
                return
            yield batch

    def start_copy(self, batch):
        """Queue the copy of ``batch`` on the copy stream; return the device tensors and the event
        that marks the end of their copy. Nothing here waits."""
        with self.streams.stream(self.copy_stream):
            tensors = tuple(self.move(tensor) for tensor in batch)
            copied = self.streams.Event()
            copied.record(self.copy_stream)
        return tensors, copied

    def hand_over(self, tensors, copied):
        """The batch, safe to use on the current (compute) stream: its kernels start after the copy."""
        compute = self.streams.current_stream(self.device)
        compute.wait_event(copied)  # the GPU waits, not the host
        for tensor in tensors:
            tensor.record_stream(compute)  # not reused before the compute stream is done with it
        return tensors
