"""The machine's decode ceilings on a dataset's own videos (see ``lerobot_dali.bench_limits``)::

python bench/limits.py DATASET [--max-frames 3000] [--run-frames 128] [--no-gpu] [--planes] [--clips]
"""

import sys

from lerobot_dali.bench_limits import main

if __name__ == "__main__":
    sys.exit(main())
