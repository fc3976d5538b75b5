"""The "onebit" logger, which onebit's optimizers and integrations say what they decide and warn
through: rank 0's line when the variance freezes or freeze_step="auto" fires (INFO), and the
warnings about a setup that trains correctly but not as meant (WARNING).

By default the lines go to stderr as onebit has always printed them — "onebit: <message>" at INFO,
"onebit: WARNING: <message>" above — so that a training script shows them with no logging set up:
when ``import onebit`` finds the logger without a handler it adds one of its own, sets the level to
INFO if none was set, and stops propagation (as transformers does for its logger), so that a root
logger configured by the application does not print each line twice. An application that routes
its logging elsewhere takes the lines over after ``import onebit`` (docs/usage/optimizers.md, "Logging")::

    import logging
    log = logging.getLogger("onebit")
    log.handlers.clear()   # onebit's own stderr handler
    log.propagate = True   # to the application's handlers (logging.basicConfig, a framework's)

or attaches its own handler to the "onebit" logger before ``import onebit``, and then onebit adds
none and leaves propagation as it is.
"""
import logging
import sys

__all__ = ["logger"]

logger = logging.getLogger("onebit")


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when a line is logged, not as it was at import: a launcher or a
    test that replaces sys.stderr later still gets the lines (as print(file=sys.stderr) did)."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


class _Formatter(logging.Formatter):
    """INFO as "onebit: <message>" (the freeze line, the same as the C++ shim's
    onebit::report_freeze), every other level as "onebit: <LEVEL>: <message>"."""

    def format(self, record):
        text = super().format(record)
        return f"onebit: {text}" if record.levelno == logging.INFO else f"onebit: {record.levelname}: {text}"


def _install_default_handler():
    if logger.handlers:  # the application has one on this logger: its choice stands
        return
    handler = _StderrHandler()
    handler.setFormatter(_Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


_install_default_handler()
