"""What a person sees: library chatter in a log file, each progress bar once (privret.chatter, privret.progress)."""

from __future__ import annotations

import io
import logging
import warnings

import pytest
from rich.console import Console

from privret.chatter import LIBRARY_LOGGERS, also_log_to, library_stderr, route_library_output
from privret.progress import Progress


@pytest.fixture()
def restore_logging():
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate) for n in LIBRARY_LOGGERS}
    filters, shown, formatted = warnings.filters[:], warnings.showwarning, warnings.formatwarning
    yield
    warnings.filters[:], warnings.showwarning, warnings.formatwarning = filters, shown, formatted
    for name, (handlers, propagate) in saved.items():
        logger = logging.getLogger(name)
        for h in logger.handlers:
            if h not in handlers:
                h.close()
        logger.handlers[:] = handlers
        logger.propagate = propagate


def _speak():
    warnings.warn("the old name is deprecated", FutureWarning)
    logging.getLogger("transformers.modeling_utils").warning("some weights were not used")
    logging.getLogger("opacus.accountants").warning("optimal order is the largest alpha")


def test_library_warnings_and_logs_go_to_the_log_file_not_stderr(restore_logging, tmp_path, capfd):
    log = tmp_path / "chatter.log"
    assert route_library_output(verbose=False, log_file=log) == log
    also_log_to(tmp_path / "earlier-run" / "privret.log")  # an earlier pipeline run in this process
    also_log_to(tmp_path / "run" / "privret.log")
    also_log_to(tmp_path / "run" / "privret.log")  # a second call for the same run: still one handler
    run_logs = [h.baseFilename for h in logging.getLogger("opacus").handlers if getattr(h, "_privret_run_log", False)]
    assert run_logs == [str((tmp_path / "run" / "privret.log").resolve())]
    reached_root: list[logging.LogRecord] = []
    root_spy = logging.Handler()
    root_spy.emit = reached_root.append
    logging.getLogger().addHandler(root_spy)
    try:
        _speak()
    finally:
        logging.getLogger().removeHandler(root_spy)
    assert reached_root == []  # the root logger's handlers (stderr in a CLI) never see them
    for handler in logging.getLogger("py.warnings").handlers:
        handler.flush()
    captured = capfd.readouterr()
    assert "deprecated" not in captured.err + captured.out and "optimal order" not in captured.err
    text = log.read_text()
    assert "FutureWarning: the old name is deprecated" in text and "some weights were not used" in text
    assert "optimal order" in text and "optimal order" in (tmp_path / "run" / "privret.log").read_text()
    assert "optimal order" not in (tmp_path / "earlier-run" / "privret.log").read_text()


def test_privrets_own_warnings_are_one_line_naming_flags(restore_logging, tmp_path):
    """Formatted as the CLI shows them: ``warning: <text>``, config fields as flags, no file name or source
    line; the libraries' warnings keep Python's form (in the log); privret's are still recorded where
    warnings are recorded (pytest records every warning of a test, so the terminal is checked by hand)."""
    from privret.cli.common import flags_in
    from privret.privacy.budget import BudgetWarning

    log = tmp_path / "chatter.log"
    route_library_output(verbose=False, log_file=log, rewrite=flags_in)
    route_library_output(verbose=False, log_file=log, rewrite=flags_in)  # twice, as in-process CLI calls do
    shown = warnings.formatwarning("past the cap (`cap` changes it)", BudgetWarning, "budget.py", 1)
    assert shown == "warning: past the cap (--budget-cap changes it)\n"
    assert "deprecated.py:3: FutureWarning: old" in warnings.formatwarning("old", FutureWarning, "deprecated.py", 3)
    with pytest.warns(BudgetWarning, match="over the cap"):
        warnings.warn("over the cap", BudgetWarning)
    assert "over the cap" not in log.read_text()


def test_verbose_leaves_library_output_where_it_was(restore_logging, tmp_path):
    before = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate) for n in LIBRARY_LOGGERS}
    assert route_library_output(verbose=True, log_file=tmp_path / "x.log") is None
    _speak()
    assert before == {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
                      for n in LIBRARY_LOGGERS}
    assert not (tmp_path / "x.log").exists()


@pytest.mark.parametrize("verbose", [False, True])
def test_a_librarys_own_tqdm_bar_goes_to_the_log_unless_verbose(verbose, restore_logging, tmp_path, capfd):
    """transformers' GGUF conversion draws a plain tqdm bar on stderr (no logging switch reaches it)."""
    import sys

    from tqdm.auto import tqdm

    log = tmp_path / "chatter.log"
    route_library_output(verbose=verbose, log_file=log)
    with library_stderr():
        for _ in tqdm(range(3), desc="Converting and de-quantizing", file=None, mininterval=0):
            pass
        print("a library's own line", file=sys.stderr)
    err = capfd.readouterr().err
    if verbose:
        assert "Converting and de-quantizing" in err and "a library's own line" in err
    else:
        assert "Converting" not in err and "own line" not in err
        assert "Converting and de-quantizing" in log.read_text() and "a library's own line" in log.read_text()


def test_a_bar_written_to_a_file_appears_once_as_plain_lines():
    sink = io.StringIO()
    with Progress(Console(file=sink, force_terminal=False, width=100)) as progress:
        task = progress.add_task("encoding corpus", total=3)
        for _ in range(3):
            progress.advance(task)
    text = sink.getvalue()
    assert "━" not in text  # no live render and no final render of the bar
    assert text.count("encoding corpus: ") == 2 and text.rstrip().endswith("encoding corpus: 3/3 (0s)")
