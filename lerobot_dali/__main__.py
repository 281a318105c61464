"""``python -m lerobot_dali``: the ``lerobot-dali`` command where no console script is installed."""

from .cli import run

run()
