"""How far you are: ``make progress`` (or ``python -m mha_course progress``).

For every exercise notebook you have in ``workspace/``, run a copy of it in a fresh kernel
(yours is never modified), collect what each check said, and print one line per
exercise::

    chapter                          exercise                          result
    01 Attention from one dot pro…   1.1 Scores (warm-up)              ✅ passed
                                     1.2 A causal mask                 ❌ the mask lets query 0 see key 1 …
                                     1.3 A padding mask                ⏳ not implemented yet
    02 Self-attention with one head  2.1 Self-attention with given …   not started (make exercise N=02)

    1 of 44 exercises done.

How it works. The list of exercises comes from the course's generated ``exercises/NN_*.ipynb``:
each ``### Exercise N.M · Title`` heading and the check called under it (``check_x(...)``).
Each of your notebooks runs top to bottom (to its last cell) with ``nbclient``, errors
allowed, within a time limit, and with ``MHA_CHECK_LOG`` naming a temporary file: every
check call appends one JSON line to it, ``{"check", "status", "message", "hint"}``
(:func:`mha_lib.checks._result.log_result`). The last run of each check is its verdict (a failed
attempt above a fixed one no longer counts), and an exercise whose code calls the stub of an
earlier one says so: "⏳ waits for exercise 12.1: halves_mask is not implemented yet". A notebook
that raises, runs past the limit, or can't be read (half-edited JSON) gives a line in the table
(a cell below the last check that raises: a line "(below the last check)" of its own),
never a traceback.

The package, by job: :mod:`~mha_course.progress.exercises` reads the table of exercises from
``exercises/``, :mod:`~mha_course.progress.runner` runs one notebook and collects its checks'
results, :mod:`~mha_course.progress.results` holds the statuses and the rows, and
:mod:`~mha_course.progress.table` prints the table (the command line). It imports neither PyTorch
nor nbclient until a notebook runs, so ``python -m mha_course progress --help`` answers at once.
"""

from __future__ import annotations

from .exercises import EXERCISE_HEADING, TITLE_HEADING, Exercise, check_calls, course_exercises, notebook_title
from .results import (ERROR, FAILED, ICONS, NO_CHECK, NOT_IMPLEMENTED, NOT_RUN, NOT_STARTED, PASSED, TIMED_OUT,
                      UNREADABLE, Report, Row)
from .runner import DEFAULT_TIMEOUT, assign_cells, check_workspace
from .table import main, render

__all__ = ["Exercise", "Row", "assign_cells", "course_exercises", "check_workspace", "render", "main",
           # also here, as in the one module this package once was:
           "DEFAULT_TIMEOUT", "Report", "check_calls", "notebook_title", "EXERCISE_HEADING", "TITLE_HEADING",
           "ICONS", "PASSED", "NOT_IMPLEMENTED", "FAILED", "ERROR",
           "NOT_STARTED", "NO_CHECK", "TIMED_OUT", "NOT_RUN", "UNREADABLE"]
