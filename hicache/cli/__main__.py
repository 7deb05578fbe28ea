"""``python -m hicache.cli``: the ``hicache`` command."""

import sys

from hicache.cli.app import main

sys.exit(main())
