"""Errors a user can cause, reported as one clear paragraph instead of a traceback.

Code anywhere in the project raises :class:`UserError` with a message that says what
is wrong and how to fix it. Entry points wrap their ``main`` in :func:`exit_on_user_error`,
which prints the paragraph to stderr and exits with status 2. Nothing is written by the
caller before the check that raises, so a refused run overwrites nothing.

With several ranks (torchrun, srun) every rank checks the same options and the same files and
raises the same error: rank 0 alone prints it, the others exit quietly with the same status.
An error only one rank can see (it lost its peers, it could not reach them) is a
:class:`RankError`, printed by the rank that raised it. A Ctrl-C that reaches an entry point (in
train.py: before training starts, when nothing is written yet) ends with one line and status 130.
"""
import functools
import logging
import os
import signal
import sys
import textwrap


class UserError(Exception):
    """Something the user can fix: a missing file, a bad config value, an impossible size."""


class RankError(UserError):
    """A :class:`UserError` that this rank alone may see (e.g. it lost the others): every rank prints its own."""


def is_main_rank():
    """Whether this process is rank 0 (or the only one), from the launcher's variable (torchrun, export_DDP_vars.sh)."""
    return os.environ.get("RANK", "0").strip() in ("0", "")


def format_user_error(error):
    """The error as a wrapped paragraph, prefixed with ``error:``."""
    text = " ".join(str(error).split())
    # Paths and commands stay whole, so that they can be copied from the message.
    return textwrap.fill("error: " + text, width=100, break_long_words=False, break_on_hyphens=False)


def exit_on_user_error(main):
    """Decorate an entry point so that a :class:`UserError` ends it with a message and exit code 2
    (printed by rank 0 alone unless it is a :class:`RankError`), and a Ctrl-C with one line and 130."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as error:
            if is_main_rank() or isinstance(error, RankError):
                print(format_user_error(error), file=sys.stderr, flush=True)
            status = 2
        except KeyboardInterrupt:  # in train.py: before StopSignals take Ctrl-C over, when nothing is written yet
            if is_main_rank():
                print("Interrupted (Ctrl-C).", file=sys.stderr, flush=True)
            status = 128 + signal.SIGINT
        if process_group_running():
            exit_now(status)  # see utils.distributed.shutdown
        sys.exit(status)

    return wrapper


def process_group_running():
    """True once torch.distributed is set up: its threads can abort the interpreter's clean-up."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def exit_now(status):
    """End the process with ``status`` once the logs and the output are flushed, skipping the
    interpreter's clean-up (destructors, atexit handlers): for a process whose clean-up can abort it."""
    logging.shutdown()  # out.log complete on disk
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
