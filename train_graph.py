"""train.py with the whole training step captured in one CUDA graph and replayed every step.

    python train_graph.py --config=short --num_epochs 4
    python train_graph.py --config=short --local_batch_size=8       # where launch overhead shows

Everything but the step is train.py's: the same set-up, loop, logging and checkpoints. The step
(forward, loss, backward and the optimiser update) runs eagerly for ``graph_warmup_steps`` steps
on a side stream, so that cuDNN picks its algorithms and every lazily made buffer exists; then it
is captured once into a CUDA graph with static input and target tensors. From then on each step
copies the batch into those tensors and replays the graph: one launch instead of hundreds of
kernel launches, which pays off when the GPU is fast and the batch small. The host loaders' batches
arrive on the GPU already, copied ahead on a side stream by train.py's prefetcher (utils/prefetch.py):
the copy into the static tensors is a device-to-device one, after the compute stream waited for them.

What makes the step capturable: a fused Adam with ``capturable=True`` whose learning rate lives in
a device tensor (the schedule updates it in place, so the graph needs no re-capture), the gradient
scaler's fused path (no host synchronisation when the optimiser handles inf checks itself), and
autocast without its weight cache.
"""
import sys

import torch

from train import main, train_step, training_loss
from utils.YParams import wants_help
from utils.accumulation import GradAccumulation
from utils.errors import UserError, exit_on_user_error


def make_graph_step(model, optimizer, loss_fn, precision, params):
    """A step function that warms up eagerly, then captures itself and replays the graph."""
    if params.grad_accum_steps > 1:
        raise UserError(f"--grad_accum_steps={params.grad_accum_steps} cannot run in train_graph.py: its CUDA "
                        "graph replays one forward and backward over the whole batch, and a graph of K "
                        "micro-batches, all but the last without DDP's all-reduce, has not been captured "
                        "and tested. Train with train.py (same options), or drop --grad_accum_steps.")
    if params.jit_mode == "compile" and params.compile_mode != "default":
        raise UserError(f"--compile_mode={params.compile_mode} makes torch.compile record CUDA graphs of its own, "
                        "and train_graph.py captures the whole step in one graph already: one cannot be "
                        "recorded inside the other. Use --compile_mode=default with train_graph.py, or "
                        f"--compile_mode={params.compile_mode} with train.py.")
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise UserError("train_graph.py captures the training step in a CUDA graph and needs a CUDA device "
                        f"(this run uses {device}). Use train.py on a CPU.")
    if params.profiler == "torch":
        # A graph captured before the profiler's first use and replayed while it records can lose its
        # kernels or fail (torch.profiler._utils._init_for_cuda_graphs, whose workaround this is): the
        # profiler is started once, empty, before the capture.
        with torch.autograd.profiler.profile():
            pass
    graph = torch.cuda.CUDAGraph()
    static = {}
    warmup_stream = torch.cuda.Stream()
    forward_loss = training_loss(model, loss_fn, params)

    one_batch = GradAccumulation(model)  # the whole batch in one forward and backward

    def eager_step(inputs, targets):
        return train_step(forward_loss, optimizer, precision, one_batch, inputs, targets)

    calls = 0

    def step(inputs, targets):
        nonlocal calls
        if calls < params.graph_warmup_steps:
            # Warm-up on a side stream, as capture requires: nothing of it may run on the default stream.
            warmup_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(warmup_stream):
                loss = eager_step(inputs, targets)
            torch.cuda.current_stream().wait_stream(warmup_stream)
        else:
            if not static:
                static["inputs"], static["targets"] = inputs.clone(), targets.clone()
                optimizer.zero_grad()  # backward in the graph makes the gradients
                # thread_local: the DataLoader's pin-memory thread may use CUDA during the capture.
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    static["loss"] = eager_step(static["inputs"], static["targets"])
            static["inputs"].copy_(inputs, non_blocking=True)
            static["targets"].copy_(targets, non_blocking=True)
            graph.replay()
            loss = static["loss"].clone()  # the next replay overwrites the static loss
        calls += 1
        return loss

    return step


@exit_on_user_error
def run():
    if not torch.cuda.is_available() and not wants_help(sys.argv[1:]):
        raise UserError("train_graph.py captures the training step in a CUDA graph, which needs a CUDA GPU, "
                        "and PyTorch sees none here. Use train.py on this machine (same options).")
    main(make_step=make_graph_step, graph_capture=True)


if __name__ == "__main__":
    run()
