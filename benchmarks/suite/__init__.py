"""The GPU suite's machinery: what runs the tutorial's measurements and GPU tests on a GPU machine, in stages.

    gpu_suite.sh   the stages (headline, preflight, ladder, profiles, tests, dali, scaling, ...), run on this
                   machine's GPU(s), or as commands of a plan for a remote GPU machine (--plan)
    plan.py        the stages' steps and prices, their overview, and the plan: the commands in sessions
    preflight.py   the first stage: what every later stage relies on, in about 30 seconds
    summary.py     the headline's summary.txt: each rung's numbers, the original's, what a step could not measure
    pack_dali.sh   DALI's wheels packed in parts that a remote machine's commands carry one at a time

The measurements themselves are the learner's tools one folder up (``benchmarks.ladder``,
``benchmarks.profiles``, ``benchmarks.layers``, ``benchmarks.ncu_layers``, ...): the suite runs them with
its sizes and budgets and packs what they write. benchmarks/README.md says how it all works.
"""
