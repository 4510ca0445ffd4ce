"""Gradient accumulation: one optimiser step over K micro-batches of each rank's batch.

With ``--grad_accum_steps=K`` the batch of an optimiser step is still the config's (the global batch,
``global_batch_size / ranks`` per rank), so the learning-rate schedule, the logged samples/s, benchy's
trials, checkpoints and ``--resume`` count steps and samples exactly as with K = 1. What changes is
inside the step: each rank's batch is split into K micro-batches, and forward and backward run on one
at a time, so the activations of only one micro-batch are alive at once (about K times less
activation memory, for K times as many smaller kernels).

The gradients of the K backward passes add up in ``.grad``. Each micro-batch's loss is scaled by 1/K
first, so that the sum is the gradient of the batch's mean loss: the same gradient, up to rounding,
as one backward pass over the whole batch. Under DDP the backward passes of all but the last
micro-batch run inside ``no_sync()``: the gradients stay local and are all-reduced once, in the last
backward (one all-reduce per bucket per optimiser step, not K). FSDP's equivalent is
``set_requires_gradient_sync(False)``: its reduce-scatter waits for the last micro-batch as well,
while the unsharded gradients are kept meanwhile (more memory than FSDP without accumulation). Only
the last micro-batch's backward can hide the all-reduce behind its computation.

FSDP also frees each block's gathered weights after its backward, and gathers them again in the next
micro-batch's forward: with accumulation alone every micro-batch pays the all-gathers. So the
non-last micro-batches also run with ``set_reshard_after_backward(False)``: their backward keeps the
weights gathered, the next forward finds them so and gathers nothing, and the last micro-batch's
backward frees them as usual (more memory meanwhile: the blocks' full weights). The blocks still free
their weights after each forward (``reshard_after_forward``) and gather them again for the backward,
so a step's all-gathers do not fall to one round: for the U-Net (9 blocks and the root, each a unit
of its own) one micro-batch gathers 19 times, each further one 9 times instead of 19 (counted on two
gloo ranks by tests/test_accumulation.py).

The split needs K to divide the local batch (refused otherwise, in utils.YParams.load_params), and
train_graph.py refuses K > 1: its captured step replays one forward and backward over the whole batch.
"""
import contextlib

from torch.nn.parallel import DistributedDataParallel


class GradAccumulation:
    """Splits a batch into ``steps`` micro-batches and says how to run each one's backward.

    ``model`` is the (possibly wrapped) model whose backward passes produce the gradients: DDP's
    wrapper, an FSDP-sharded model, or a model on one rank (or under ``noddp``), which has nothing to
    synchronise.
    """

    def __init__(self, model, steps=1):
        self.model, self.steps = model, steps

    def micro_batches(self, inputs, targets):
        """``(inputs, targets, sync)`` per micro-batch: views of the batch along its first dimension
        (a channels_last batch stays channels_last), and the context that the micro-batch's forward
        and backward run in. With one step: the batch itself, in a null context."""
        last = self.steps - 1
        for index, micro in enumerate(zip(inputs.chunk(self.steps), targets.chunk(self.steps))):
            yield (*micro, contextlib.nullcontext() if index == last else self.no_sync())

    def scale(self, loss):
        """The micro-batch's share of the batch's mean loss: the K backward passes add up to its gradient."""
        return loss / self.steps

    def no_sync(self):
        """A context in which backward passes keep their gradients local."""
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        if hasattr(self.model, "set_requires_gradient_sync"):  # fully_shard's FSDPModule
            return fsdp_no_sync(self.model)
        return contextlib.nullcontext()


@contextlib.contextmanager
def fsdp_no_sync(model):
    """No reduce-scatter, and the gathered weights kept after backward, for this micro-batch; both back
    to FSDP's defaults for the next (the last micro-batch runs with them)."""
    # set_reshard_after_backward is missing from some torch versions' fully_shard: without it each
    # micro-batch gathers the weights again (right, with more communication).
    keep_gathered = getattr(model, "set_reshard_after_backward", lambda _: None)
    model.set_requires_gradient_sync(False)
    keep_gathered(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        keep_gathered(True)
