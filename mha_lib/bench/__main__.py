"""``python -m mha_lib.bench``: see :mod:`mha_lib.bench.cli`."""

import sys

from .cli import main

sys.exit(main())
