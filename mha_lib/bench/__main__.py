"""``python -m mha_lib.bench``: see :mod:`mha_lib.bench.cli`.

``python -m mha_lib.bench decode ...`` runs the decoding benchmark of chapter 11 instead
(:mod:`mha_lib.bench.decode`: a KV cache against recomputing the prefix; ``decode --help``).
"""

import sys

if sys.argv[1:2] == ["decode"]:
    from .decode import main

    sys.exit(main(sys.argv[2:]))

from .cli import main

sys.exit(main())
