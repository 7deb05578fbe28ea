"""``python -m hicache.daemon``: see ``hicache.daemon.cli.main``."""

import sys

from hicache.daemon.cli import main

sys.exit(main())
