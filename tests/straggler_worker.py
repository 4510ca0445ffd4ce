"""train.py with one rank made a straggler, for tests/test_step_spread.py; run under torchrun:

    TEST_STRAGGLER_RANK=1 TEST_STRAGGLER_SLEEP_S=0.3 TEST_GATHER_COUNTS=<dir> \\
        torchrun --standalone --nproc_per_node=3 tests/straggler_worker.py --config=test ...

The rank TEST_STRAGGLER_RANK sleeps TEST_STRAGGLER_SLEEP_S at the start of each training forward (inside its
step, as a slow GPU or a shared CPU core would be slow); the others train as they would. Every rank counts its
calls of torch.distributed.all_gather (the collective that gathers the spread) in TEST_GATHER_COUNTS/rank<N>.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch.distributed  # noqa: E402

import train  # noqa: E402

RANK = int(os.environ["RANK"])


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


torch.distributed.all_gather = count_calls(torch.distributed.all_gather,
                                           os.path.join(os.environ["TEST_GATHER_COUNTS"], f"rank{RANK}"))
if RANK == int(os.environ["TEST_STRAGGLER_RANK"]):
    train.build_model = slowed(train.build_model, float(os.environ["TEST_STRAGGLER_SLEEP_S"]))

if __name__ == "__main__":
    train.main()
