"""``python -m lerobot_dali``: the ``lerobot-dali`` command where no console script is installed."""

import sys

from .cli import main

sys.exit(main())
