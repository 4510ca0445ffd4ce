"""Errors a user can cause, reported as one clear paragraph instead of a traceback.

Code anywhere in the project raises :class:`UserError` with a message that says what
is wrong and how to fix it. Entry points wrap their ``main`` in :func:`exit_on_user_error`,
which prints the paragraph to stderr and exits with status 2. Nothing is written by the
caller before the check that raises, so a refused run overwrites nothing.
"""
import functools
import logging
import os
import sys
import textwrap


class UserError(Exception):
    """Something the user can fix: a missing file, a bad config value, an impossible size."""


def format_user_error(error):
    """The error as a wrapped paragraph, prefixed with ``error:``."""
    text = " ".join(str(error).split())
    # Paths and commands stay whole, so that they can be copied from the message.
    return textwrap.fill("error: " + text, width=100, break_long_words=False, break_on_hyphens=False)


def exit_on_user_error(main):
    """Decorate an entry point so that a :class:`UserError` ends it with a message and exit code 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as error:
            print(format_user_error(error), file=sys.stderr, flush=True)
            if process_group_running():
                exit_now(2)  # see utils.distributed.shutdown
            sys.exit(2)

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
