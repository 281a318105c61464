"""Benchmark a dataset served over real HTTP (range requests) from this machine: the remote path end to end.

Serves the folder holding DATASET with ``tests/http_server.py`` on 127.0.0.1 and runs ``lerobot-dali bench``
on its URL; every further argument goes to the bench. Prints the server's request counts at the end.

Unless ``--pool-size`` (or ``--episode-pool-size``) is given, lerobot-dali's episode pool holds 4 episodes: the
iterator prefetches the pool's episodes before its first batch (counted in "first s"), so with the bench's
default pool (64) a 12-episode dataset is all on local disk before the clock starts and the window never reads
the network::

    python bench/remote_http.py ~/.cache/lerobot_dali/bench/av1_3cam_480x640_30fps_gop2_12ep_300f \\
        --device cpu --loaders lerobot-dali pyav-dataloader
"""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.http_server lives in the checkout

from tests.http_server import serve_folder

POOL_SIZE = 4  # of the default bench set's 12 episodes: admissions, and their fetches, fall in the window


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    dataset = Path(argv[0]).expanduser().resolve()
    # (first: an episode pool size given among argv, however argparse spells it, comes later and wins)
    options = ["--pool-size", str(POOL_SIZE), *argv[1:]]
    with serve_folder(dataset.parent) as server:
        command = ["lerobot-dali", "bench", "--dataset", f"{server.url}/{dataset.name}", *options]
        code = subprocess.call(command)
        counts = sorted(server.counts.items())
    sys.stderr.write(f"HTTP requests served: {dict(counts)}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
