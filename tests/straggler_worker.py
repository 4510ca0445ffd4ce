"""train.py with one rank made a straggler and one starved of data, for tests/test_step_spread.py; run under
torchrun:

    TEST_STRAGGLER_RANK=1 TEST_STARVED_RANK=2 TEST_STRAGGLER_SLEEP_S=0.3 TEST_GATHER_COUNTS=<dir> \\
        torchrun --standalone --nproc_per_node=3 tests/straggler_worker.py --config=test ...

The rank TEST_STRAGGLER_RANK sleeps TEST_STRAGGLER_SLEEP_S at the start of each training forward (inside its
step, as a slow GPU or a shared CPU core would be slow); the rank TEST_STARVED_RANK sleeps as long in its
training loader, before it hands over each batch (outside the step, as a starved loader would be slow); the
others train as they would (-1: no such rank). Every rank counts its calls of torch.distributed.all_gather (the
collective that gathers the spread) in TEST_GATHER_COUNTS/rank<N>.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch.distributed  # noqa: E402

import train  # noqa: E402

RANK = int(os.environ["RANK"])
SLEEP_S = float(os.environ["TEST_STRAGGLER_SLEEP_S"])


def count_calls(collective, path):
    calls = 0

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        with open(path, "w") as f:  # written at each call: a gloo rank may leave without running atexit
            f.write(str(calls))
        return collective(*args, **kwargs)

    return counted


def slowed(build_model, seconds):
    def build(*args, **kwargs):
        model = build_model(*args, **kwargs)
        model.register_forward_pre_hook(lambda module, _: time.sleep(seconds) if module.training else None)
        return model

    return build


class SlowLoader:
    """The loader, sleeping ``seconds`` before each batch it hands over; everything else is the loader's."""

    def __init__(self, loader, seconds):
        self.loader, self.seconds = loader, seconds

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            time.sleep(self.seconds)
            yield batch


def starved(build_loaders, seconds):
    def build(*args, **kwargs):
        train_loader, val_loader = build_loaders(*args, **kwargs)
        return SlowLoader(train_loader, seconds), val_loader

    return build


torch.distributed.all_gather = count_calls(torch.distributed.all_gather,
                                           os.path.join(os.environ["TEST_GATHER_COUNTS"], f"rank{RANK}"))
if RANK == int(os.environ["TEST_STRAGGLER_RANK"]):
    train.build_model = slowed(train.build_model, SLEEP_S)
if RANK == int(os.environ.get("TEST_STARVED_RANK", "-1")):
    train.build_loaders = starved(train.build_loaders, SLEEP_S)

if __name__ == "__main__":
    train.main()
