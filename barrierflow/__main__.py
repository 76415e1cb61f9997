"""``python -m barrierflow``: the same as the ``barrierflow`` command."""

import sys

from barrierflow.cli import main

sys.exit(main())
