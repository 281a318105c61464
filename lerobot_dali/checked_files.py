"""How many of a dataset's files are each checked before the first batch, a read a file; past it a file is checked
when a batch first reaches it.

Opening a v2.x dataset reads each episode's data file's footer (:mod:`.episode_data_files`), and building an iterator
each video file's header (:mod:`.camera_codecs`). A local file costs ~0.3-1 ms of CPU the first time, none later: its
footer and its header are kept on disk with its stamp (:mod:`.row_count_store`, :mod:`.file_format_store`), so the
data files and the videos share one bound. A remote file costs requests every new node makes again (a ranged read,
or 3 for a packet index where the node's store misses it), and 16 at once keep the Hub's request rate limits only
for a few thousand.
"""

from __future__ import annotations

__all__ = ["CHECKED_FILES", "CHECKED_FILES_REMOTE"]

#: Most local files of a kind (a v2.x dataset's data files, a camera's videos) each checked: ~0.3-1 ms a file the
#: first time (100,000: up to a minute or two of CPU, once per cache folder), none later.
CHECKED_FILES = 100_000
#: Most remote files of a kind each checked: a few seconds 16 at once, well within a Hub's rate limits; a v2.1
#: dataset of 50,000 episodes would otherwise cost every node 50,000-150,000 requests before its first batch.
CHECKED_FILES_REMOTE = 2_000
