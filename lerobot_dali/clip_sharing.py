"""Which samples of a batch decode one clip together, for cameras DALI decodes (made for NVDEC).

DALI's GPU decoder sets up a decoder for every sample it decodes (``fn.decoders.video``: an FFmpeg demuxer over the
clip and its frame index, a bitstream filter, an NVDEC parser and GPU frame buffers; the NVDEC decoder itself it
leases from a cache), so a batch of one-frame windows spent ~32 ms per clip per DALI thread on an H200
(``bench/README.md``) where the frames themselves take well under 1 ms. Samples of a batch that
read one video file (a v3.0 file holds many episodes) can instead send one clip holding all their frames: its
first sample decodes it, and the graph hands every sample of the group its own frames
(:func:`~.dali_video.decode_shared_clips`).

A group is bounded by the distinct frames its clip yields (:data:`SHARED_CLIP_FRAMES`): the graph copies the whole
group's frames to each of its samples before each picks its own, so a group of ``n`` samples costs ``n`` times its
frames in device memory for a moment. A group is kept only where its clip holds no more packets than its samples'
clips would together (a file of open GOPs makes one run of its clip, and far apart frames would join into a long
one); else its samples decode alone.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from .clips import plan_clip
from .packet_index import PacketIndex

__all__ = ["SHARED_CLIP_FRAMES", "ClipShare", "share_clips"]

#: Distinct frames one shared clip may yield: one-frame windows share 8 to a clip, 2-frame windows 4.
SHARED_CLIP_FRAMES = 8


@dataclass(frozen=True, eq=False)
class ClipShare:
    """A batch's samples grouped by the clip they decode: ``groups[g]`` the samples (ascending, the first
    decodes) and ``frames[g]`` the display frame numbers its clip yields (distinct, ascending)."""

    groups: list[np.ndarray]
    frames: list[np.ndarray]
    #: ``alone_frames[g]``: the packets the group's samples' own clips would hold together, as planned (0 for a
    #: sample alone).
    alone_frames: list[int]

    def takes(self, batch_size: int) -> np.ndarray:
        """Per sample, the sample whose clip holds its frames (itself where it decodes), int32."""
        take = np.empty(batch_size, dtype=np.int32)
        for members in self.groups:
            take[members] = members[0]
        return take

    def orders(self, numbers: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per sample, where each of its frames ``numbers[s]`` is among its group clip's frames, int32."""
        out: list[np.ndarray] = [np.empty(0, np.int32)] * len(numbers)
        for members, frames in zip(self.groups, self.frames, strict=True):
            for s in members.tolist():
                out[s] = np.searchsorted(frames, numbers[s]).astype(np.int32)
        return out


def share_clips(
    paths: Sequence[str],
    indexes: Sequence[PacketIndex],
    numbers: Sequence[np.ndarray],
    *,
    max_frames: int,
    alone_files: Collection[str] = (),
) -> ClipShare:
    """Group samples (``paths[s]``, ``indexes[s]``: its file and packet index; ``numbers[s]``: the display frame
    numbers it shows) that read one file, in sample order, while a group's distinct frames stay within
    ``max_frames`` (a sample with more decodes alone); a group whose clip would hold more packets than its samples'
    own clips together is split into samples alone, as are the samples of ``alone_files``."""
    open_groups: dict[str, tuple[list[int], np.ndarray]] = {}
    closed: list[tuple[list[int], np.ndarray]] = []
    for s, (path, wanted) in enumerate(zip(paths, numbers, strict=True)):
        distinct = np.unique(wanted)
        held = open_groups.get(path)
        if path in alone_files:
            closed.append(([s], distinct))
            continue
        if held is not None:
            union = np.union1d(held[1], distinct)
            if len(union) <= max_frames:
                held[0].append(s)
                open_groups[path] = (held[0], union)
                continue
            closed.append(held)
        open_groups[path] = ([s], distinct)
    closed += open_groups.values()
    groups: list[np.ndarray] = []
    frames: list[np.ndarray] = []
    alone_frames: list[int] = []
    for members, union in sorted(closed, key=lambda group: group[0][0]):
        index = indexes[members[0]]
        if len(members) == 1:
            groups.append(np.array(members))
            frames.append(union)
            alone_frames.append(0)
            continue
        each = [plan_clip(index, numbers[s]).frame_count for s in members]
        if plan_clip(index, union).frame_count > sum(each):
            groups += [np.array([s]) for s in members]
            frames += [np.unique(numbers[s]) for s in members]
            alone_frames += [0] * len(members)  # (alone: nothing shared to outgrow)
            continue
        groups.append(np.array(members))
        frames.append(union)
        alone_frames.append(sum(each))
    return ClipShare(groups=groups, frames=frames, alone_frames=alone_frames)
