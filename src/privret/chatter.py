"""Where the libraries' own warnings, log lines and tqdm bars go.

transformers, sentence-transformers, Opacus and torch talk on their own: FutureWarnings about
renamed methods, Opacus' "optimal order" remark, the backward-hook UserWarning, tqdm bars while
loading, converting (GGUF) or saving weights. None of it is privret's output. The CLI calls
:func:`route_library_output` once: the libraries' Python warnings and loggers then go to a log file
(``--log-file``, default :func:`default_log_file`) instead of the terminal, the libraries' tqdm bars
are switched off, and privret's own output (rich tables, progress bars, errors, and its own
warnings such as the budget registry's, one line each: ``warning: <message>``) is all that is left.
``--verbose`` leaves everything on stderr. A pipeline run also appends the
chatter to ``RUN_DIR/privret.log`` (:func:`also_log_to`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

LIBRARY_LOGGERS = ("py.warnings", "transformers", "sentence_transformers", "opacus", "huggingface_hub", "torch",
                   "accelerate", "peft")
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
RUN_LOG = "privret.log"  # a pipeline run's own log, in its run directory
_routed_to: Path | None = None  # where route_library_output sends the chatter (None: nowhere, stderr)


def default_log_file() -> Path:
    """``$PRIVRET_LOG_FILE``, else ``$XDG_CACHE_HOME/privret/privret.log`` (``~/.cache`` by default)."""
    if os.environ.get("PRIVRET_LOG_FILE"):
        return Path(os.environ["PRIVRET_LOG_FILE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "privret" / "privret.log"


def _file_handler(path: Path) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler


def route_library_output(*, verbose: bool, log_file: Path | None = None,
                         rewrite: Callable[[str], str] = str) -> Path | None:
    """Send the libraries' warnings and log lines to ``log_file`` (returned), or leave them on stderr;
    privret's own warnings become one line on stderr, their text passed through ``rewrite`` (the CLI
    names config fields as its flags).

    Idempotent per process: a second call replaces the handlers of the first."""
    global _routed_to
    if verbose:
        _routed_to = None
        return None
    path = _routed_to = log_file or default_log_file()
    _route_warnings(rewrite)
    handler = _file_handler(path)
    handler._privret = True
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if getattr(h, "_privret", False)]:
            logger.removeHandler(old)
            old.close()
        logger.addHandler(handler)
        logger.propagate = False
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return path
    hf_logging.disable_progress_bar()
    hf_logging.disable_default_handler()
    hf_logging.set_verbosity_warning()
    return path


def _route_warnings(rewrite: Callable[[str], str]) -> None:
    """Show privret's own warnings (their category is defined in privret) as one line, ``warning: <text>``;
    log the others.

    Installed as ``warnings.showwarning`` and ``warnings.formatwarning`` over whatever was there (kept, for
    privret's warnings, so that ``warnings.catch_warnings(record=True)`` still records them)."""
    shown, formatted = warnings.showwarning, warnings.formatwarning
    show_original = getattr(shown, "_privret_original", shown)
    format_original = getattr(formatted, "_privret_original", formatted)

    def show(message, category, filename, lineno, file=None, line=None):
        if _is_privret(category):
            show_original(message, category, filename, lineno, file, line)
        else:
            logging.getLogger("py.warnings").warning(
                format_original(message, category, filename, lineno, line).rstrip())

    def format_one_line(message, category, filename, lineno, line=None):
        if _is_privret(category):
            return f"warning: {rewrite(str(message))}\n"
        return format_original(message, category, filename, lineno, line)

    show._privret_original, format_one_line._privret_original = show_original, format_original
    warnings.showwarning, warnings.formatwarning = show, format_one_line


def _is_privret(category: type) -> bool:
    return category.__module__.split(".")[0] == "privret"


def also_log_to(path: Path) -> None:
    """Append the libraries' output to ``path`` as well (the run's own log), whatever the routing.

    One run log at a time: a later call (the next pipeline run in the same process) replaces the
    earlier run's handler, so a run's log never receives another run's chatter."""
    target = str(Path(path).resolve())
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if getattr(h, "_privret_run_log", False)]:
            if old.baseFilename == target:
                continue
            logger.removeHandler(old)
            old.close()
    if any(getattr(h, "baseFilename", None) == target for h in logging.getLogger(LIBRARY_LOGGERS[0]).handlers):
        return
    handler = _file_handler(path)
    handler._privret_run_log = True
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).addHandler(handler)


@contextlib.contextmanager
def library_stderr():
    """Around a library call that writes to stderr itself (transformers' GGUF conversion draws a plain tqdm
    bar that no logging switch reaches): what it writes goes to the log file when the chatter is routed
    there (:func:`route_library_output`), and to stderr as before otherwise."""
    if _routed_to is None:
        yield
        return
    with open(_routed_to, "a", encoding="utf-8") as log, contextlib.redirect_stderr(log):
        yield
