"""``python -m mha_lib start|list|progress``: the same as ``python -m mha_course`` (see there).

The learner's commands live in :mod:`mha_course`, apart from the library, so that ``make
exercise`` and ``make progress`` never import PyTorch. This door imports the library first
(``mha_lib/__init__.py`` runs before any ``python -m mha_lib...``), so it answers a second or
two later; it stays because the notebooks name it.
"""

import sys

from mha_course.__main__ import main

sys.exit(main())
