"""The learner's commands: ``make exercise`` and ``make progress`` (``python -m mha_course``).

    python -m mha_course start 01     copy exercise 01 to workspace/ (never overwrites)
    python -m mha_course list         list the exercises and the ones you have started
    python -m mha_course progress     run your copies and show which exercises pass
    python -m mha_course update       update the course (git pull), keeping your edits in workspace/

A package apart from :mod:`mha_lib`, and importing nothing from it, so that these commands
never load PyTorch and answer at once: ``python -m mha_lib.x`` would run ``mha_lib/__init__.py``,
which imports the whole library. The notebooks that ``progress`` runs import ``mha_lib`` in
their own kernels; their checks (:mod:`mha_lib.checks`) report to this process through a file
of JSON lines (``MHA_CHECK_LOG``).

- :mod:`mha_course.workspace`: your own copies of the exercises, in ``workspace/``;
- :mod:`mha_course.progress`: runs them and shows which exercises pass;
- :mod:`mha_course.update`: brings the course up to date after you ran (and saved) its notebooks;
- :mod:`mha_course.__main__`: the command line.
"""
