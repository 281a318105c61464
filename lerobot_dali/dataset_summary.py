"""A dataset at a glance (``lerobot-dali info``): declared metadata next to what the video files hold."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .dataset_reader import LeRobotDatasetReader
from .video_probe import probe_video

__all__ = ["summarize"]


def summarize(reader: LeRobotDatasetReader, *, probe: bool = True) -> dict[str, Any]:
    """A JSON-ready summary. ``probe`` opens the first video of each camera (packet headers only)."""
    info = reader.info
    episodes = reader.episodes
    data_files = Counter(zip(episodes.data_chunk_index.tolist(), episodes.data_file_index.tolist(), strict=True))
    cameras: dict[str, Any] = {}
    for key in reader.camera_keys:
        files = episodes.cameras[key]
        per_file = Counter(zip(files.chunk_index.tolist(), files.file_index.tolist(), strict=True))
        declared = info.features[key].video
        entry: dict[str, Any] = {
            "declared_codec": declared.codec if declared else None,
            "declared_fps": declared.fps if declared else None,
            "video_files": len(per_file),
            "episodes_per_file": _spread(per_file.values()),
        }
        if probe and reader.num_episodes:
            found = probe_video(reader.video(0, key).path, filesystem=reader.location.fs)
            entry.update(
                codec=found.codec,
                resolution=[found.height, found.width],
                fps=found.fps,
                pix_fmt=found.pix_fmt,
                gop_frames=found.gop_frames,
                b_frames=found.has_b_frames,
            )
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
    }


def _spread(values: Any) -> dict[str, int]:
    values = list(values)
    return {"min": min(values), "max": max(values)} if values else {"min": 0, "max": 0}
