"""A dataset at a glance (``lerobot-dali info``): declared metadata next to what the video files hold."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from .camera_codecs import file_positions, survey_camera
from .dataset_reader import LeRobotDatasetReader
from .errors import DatasetError, FrameTimestampError
from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource, row_frame_numbers
from .packet_index import PacketIndex
from .packet_index_cache import load_episode_packet_index
from .video_probe import describe_index

__all__ = ["CODEC_SURVEY_MAX_FILES", "summarize"]

#: Most video files of a camera whose codecs ``info`` lists (a header each: v3.0's few files, not a v2.x dataset's one
#: per episode), so a camera whose files mix codecs says so.
CODEC_SURVEY_MAX_FILES = 16


def summarize(
    reader: LeRobotDatasetReader, *, probe: bool = True, tolerance_s: float = DEFAULT_TOLERANCE_S
) -> dict[str, Any]:
    """A JSON-ready summary. ``probe`` opens the first video of each camera (packet headers only) and looks
    every row of the first episode up in it within ``tolerance_s``, once per timestamp source (``frame_lookup``:
    ``"ok"`` or why not), so a dataset whose timestamps miss its video says which ``timestamp_source`` reads it.
    A camera whose first video does not open has ``probe_error`` (why) in place of what the video holds; one of at
    most :data:`CODEC_SURVEY_MAX_FILES` files that all open has ``file_codecs`` (codec -> files, the first file's
    first); one whose first video does not hold what info.json declares of it has ``info_json_unlike`` (what, as
    :meth:`~.dataset_info.Feature.unlike_video` says it)."""
    info = reader.info
    episodes = reader.episodes
    data_files = Counter(zip(episodes.data_chunk_index.tolist(), episodes.data_file_index.tolist(), strict=True))
    cameras: dict[str, Any] = {}
    first_rows = reader.read_episode(0, []) if probe and reader.num_episodes and reader.camera_keys else None
    for key in reader.camera_keys:
        files = episodes.cameras[key]
        per_file = Counter(zip(files.chunk_index.tolist(), files.file_index.tolist(), strict=True))
        declared = info.features[key].video
        entry: dict[str, Any] = {
            "declared_codec": declared.codec if declared else None,
            "declared_fps": declared.fps if declared else None,
            "depth_map": bool(declared and declared.is_depth_map),
            "video_files": len(per_file),
            "episodes_per_file": _spread(per_file.values()),
        }
        if first_rows is not None:
            try:
                _, index = load_episode_packet_index(reader, 0, key)
            except (DatasetError, PermissionError) as e:  # one damaged, missing or refused video: the rest stands
                entry["probe_error"] = str(e) if isinstance(e, DatasetError) else f"{type(e).__name__}: {e}"
                cameras[key] = entry
                continue
            found = describe_index(index)
            entry.update(
                codec=found.codec,
                resolution=[found.height, found.width],
                fps=found.fps,
                frame_count=found.frame_count,
                pix_fmt=found.pix_fmt,
                gop_frames=found.gop_frames,
                b_frames=found.has_b_frames,
                frame_lookup=_lookup_by_source(reader, key, index, first_rows, tolerance_s),
                info_json_unlike=info.features[key].unlike_video(found.codec, found.fps, (found.height, found.width)),
            )
            codecs = _file_codecs(reader, key)
            if codecs is not None:
                entry["file_codecs"] = codecs
        cameras[key] = entry
    return {
        "source": reader.location.description,
        "codebase_version": info.codebase_version,
        "robot_type": info.robot_type,
        "fps": info.fps,
        "total_episodes": reader.num_episodes,
        "total_frames": reader.num_frames,
        "total_tasks": len(reader.tasks),
        "data_files": len(data_files),
        "episodes_per_data_file": _spread(data_files.values()),
        "features": {k: {"dtype": f.dtype, "shape": list(f.shape)} for k, f in info.features.items()},
        "cameras": cameras,
        "image_cameras": list(reader.image_keys),
        "depth_image_cameras": list(info.depth_image_units(reader.image_keys)),
    }


def _file_codecs(reader: LeRobotDatasetReader, camera: str) -> dict[str, int] | None:
    """How many of ``camera``'s video files hold each codec, in file order (their headers, as the iterator surveys
    them: :mod:`.camera_codecs`); None where it has more than :data:`CODEC_SURVEY_MAX_FILES` files or one does not
    open (``lerobot-dali check`` reads every file)."""
    positions = file_positions(reader, camera)
    if len(positions) > CODEC_SURVEY_MAX_FILES:
        return None
    try:
        return survey_camera(reader, camera, positions).codecs()
    except (DatasetError, PermissionError):  # (a file this user may not read, as one damaged)
        return None


def _lookup_by_source(
    reader: LeRobotDatasetReader, camera: str, index: PacketIndex, rows: Mapping[str, np.ndarray], tolerance_s: float
) -> dict[str, str]:
    """Whether every row of the first episode (``rows``) finds its frame, by each timestamp source, within
    ``tolerance_s``: ``"ok"``, or the lookup's error message."""
    every_row = np.arange(len(rows["timestamp"]))
    found = {}
    for source in TimestampSource:
        if source is TimestampSource.FRAME_INDEX and "frame_index" not in rows:
            continue
        try:
            row_frame_numbers(
                reader, 0, camera, rows, every_row, index, timestamp_source=source, tolerance_s=tolerance_s
            )
            found[source.value] = "ok"
        except FrameTimestampError as e:
            found[source.value] = str(e)
    return found


def _spread(values: Any) -> dict[str, int]:
    values = list(values)
    return {"min": min(values), "max": max(values)} if values else {"min": 0, "max": 0}
