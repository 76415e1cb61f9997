"""``python -m barrierflow``: the same as the ``barrierflow`` command."""

import sys

from barrierflow.app.cli import main

sys.exit(main())
