"""Name the file behind a failure of DALI's video decoder.

DALI decodes a whole batch of clips in one operator call, and its error names neither the sample nor the
file ("Could not find a valid video stream in a file in memory file"). A batch is a pure function of the
stream position, so after a failure the clips of the batches that may have been in flight are rebuilt and
decoded again, in halves, until the one clip DALI rejects is found; its file, episode and camera go into a
:class:`~lerobot_dali.errors.VideoDecodeError`. This runs only on the error path.
"""

from __future__ import annotations

import logging

import numpy as np

from .batch_source import BatchSource
from .dali_graph import FieldKind
from .dali_video import dali_error_reason, decode_clip_batch
from .errors import DatasetError, VideoDecodeError

__all__ = ["locate_clip_failure"]

logger = logging.getLogger(__name__)


def locate_clip_failure(
    source: BatchSource, epoch: int, start: int, stop: int, *, device_id: int | None, cause: BaseException
) -> DatasetError | None:
    """The first clip of samples ``[start, stop)`` of ``epoch`` that DALI cannot decode, as an error naming
    its file (a DatasetError saying so where a remote file changed on the server since the dataset was opened), or
    None when every clip decodes (the failure was not a bad clip)."""
    spec = source.spec
    cameras = [(i, f) for i, f in enumerate(source.fields) if f.kind is FieldKind.CLIP]
    if not cameras or start >= stop:
        return None
    episode_pos, frame = spec.order.samples(epoch, start, stop)
    samples = [
        source.assemble(episode_pos[k : k + 1], frame[k : k + 1], epoch=epoch, positions=np.array([start + k]))
        for k in range(len(episode_pos))
    ]  # positions key the augmentation draws: assemble refuses to guess them
    reason = dali_error_reason(cause)
    shared = _shared_clips(source, epoch, start, stop, [i for i, f in cameras if spec.camera_feeds[f.name].share_clips])
    for i, field in cameras:
        clips = [outputs[i][0] for outputs in samples]
        wanted = [outputs[i + 1][0] for outputs in samples]
        files = [spec.reader.video(int(pos), field.name).path for pos in episode_pos]
        # A camera sharing clips: its batches' shared clips after the samples' own, each of its samples' file.
        theirs = shared.get(i, [])
        clips += [clip for clip, _, _ in theirs]
        wanted += [indices for _, indices, _ in theirs]
        owners = [[k] for k in range(len(episode_pos))] + [members for _, _, members in theirs]
        files += [files[members[0]] for _, _, members in theirs]
        bad = _first_failing(clips, wanted, files, device_id=None if field.decode_device == "cpu" else device_id)
        if bad is None:
            continue
        # (a remote file replaced by one of its size mid-read: its old packet index read the new bytes)
        changed = spec.reader.changed_on_server(files if bad == UNATTRIBUTED else [files[bad]])
        if changed is not None:
            return changed
        if bad == UNATTRIBUTED:
            named = sorted(set(files))
            episodes = sorted({int(spec.reader.episodes.episode_index[int(p)]) for p in episode_pos})
            # (a union of local and remote datasets: the cache holds only its remote files' ranges)
            remote = "" if all(spec.reader.episode_is_local(int(p)) for p in episode_pos) else (
                "; for a remote dataset, also delete the prefetch cache (cache_dir, by default "
                "$LEROBOT_DALI_CACHE/prefetch), which may hold bad byte ranges"
            )  # fmt: skip
            return VideoDecodeError(
                f"DALI cannot decode camera {field.name}'s frames of episodes {episodes[:10]} ({reason}), and clips "
                f"of several files fail on their own: {named[:5]}{' ...' if len(named) > 5 else ''}. Either these "
                f"files are damaged (re-download or re-encode them{remote}) or the decoder itself failed (out of GPU "
                "memory?)."
            )
        episodes = sorted({int(spec.reader.episodes.episode_index[int(episode_pos[k])]) for k in owners[bad]})
        whose = f"episode {episodes[0]}" if len(episodes) == 1 else f"episodes {episodes} (one clip they share)"
        return VideoDecodeError(
            f"{files[bad]}: DALI cannot decode the frames of {whose}, camera {field.name} ({reason}); "
            "the video is corrupt: re-encode or re-download it."
        )
    logger.info("every clip of rank %d's samples [%d, %d) of epoch %d decodes on its own; the failure was elsewhere",
                spec.order.rank, start, stop, epoch)  # fmt: skip
    return None


def _shared_clips(
    source: BatchSource, epoch: int, start: int, stop: int, fields: list[int]
) -> dict[int, list[tuple[np.ndarray, np.ndarray, list[int]]]]:
    """Per CLIP field of ``fields`` (cameras sharing clips, :mod:`.clip_sharing`), the clips that samples of the
    batches from ``start`` (a batch's first sample) to ``stop`` share, as the batches made them: (clip, frame indices,
    the samples sharing it, counted from ``start``). A sample's own clip may decode where its group's does not."""
    if not fields:
        return {}
    spec = source.spec
    out: dict[int, list[tuple[np.ndarray, np.ndarray, list[int]]]] = {i: [] for i in fields}
    for first in range(start, stop, spec.batch_size):
        last = min(stop, first + spec.batch_size)
        episode_pos, frame = spec.order.samples(epoch, first, last)
        outputs = source.assemble(episode_pos, frame, epoch=epoch, positions=np.arange(first, last))
        for i in fields:
            takes = outputs[i + 3]
            for k, (clip, indices) in enumerate(zip(outputs[i], outputs[i + 1], strict=True)):
                members = np.flatnonzero(takes == k)
                if len(clip) and len(members) > 1:  # (a group of one: the sample's own clip)
                    out[i].append((clip, indices, (members + first - start).tolist()))
    return out


#: :func:`_first_failing`'s answer when clips fail but none can be blamed alone.
UNATTRIBUTED = -1


def _first_failing(
    clips: list[np.ndarray], wanted: list[np.ndarray], files: list[str], *, device_id: int | None
) -> int | None:
    """The first clip that fails on its own; None when all decode; :data:`UNATTRIBUTED` when clips of other files
    fail alone too. A failure of the decoder itself (a CUDA out-of-memory while the training holds the GPU) fails
    every part, which would blame the first clip: unless some part decoded, a clip of another file must decode
    for the blame to stand."""

    def decodes(members: list[int]) -> bool:
        try:
            decode_clip_batch([clips[k] for k in members], [wanted[k] for k in members], device_id=device_id)
        except Exception:  # DALI raises RuntimeError; any failure counts as "this part fails"
            return False
        return True

    lo, hi = 0, len(clips)
    if decodes(list(range(lo, hi))):
        return None
    some_decoded = False
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if decodes(list(range(lo, mid))):
            lo, some_decoded = mid, True
        else:
            hi = mid
    if some_decoded:
        return lo
    # One clip of each of up to 3 other files, alone (another file may be bad too): one that decodes clears the
    # decoder; none at all (one file only) leaves the blame where it is.
    firsts = {files[k]: k for k in reversed(range(len(clips))) if files[k] != files[lo]}
    others = sorted(firsts.values())[:3]
    if others and not any(decodes([k]) for k in others):
        return UNATTRIBUTED
    return lo
