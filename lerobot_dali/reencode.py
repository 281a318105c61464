"""Re-encode a dataset's videos with keyframes close together, or into a codec the GPU decodes; each frame keeps
its timestamp.

Random access decodes from the keyframe before each frame. In a dataset recorded with keyframes 250 frames
apart, a sampled frame costs about 125 decodes (``lerobot-dali info`` shows this). AV1, LeRobot's default codec,
has no NVDEC on A100/H100/H200, so there it decodes on the CPU. Re-encoded at GOP 2 (LeRobot's default) in
H.264 or HEVC, the same dataset decodes about 1.5 frames per frame, on NVDEC.

What changes in the copy:
- Only the videos change (audio tracks are dropped: LeRobot reads video alone). Every other file is copied byte
  for byte, and info.json changes only in its ``video.codec`` (and ``has_audio``).
- Every re-encoded frame keeps its presentation timestamp and time base exactly. This is checked against
  the source's packet index after each file. So parquet timestamps, ``meta/episodes``' per-file seconds, and
  v3.0's several episodes per file all still line up.
- Depth-map videos are copied unchanged, because a lossy re-encode would change depth values.
- ``meta/stats.json`` keeps the source's image statistics, which the lossy re-encode moves slightly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from .cache_dirs import atomic_file, try_flock_where_supported
from .clips import plan_clip
from .dataset_info import DatasetInfo, template_pattern
from .dataset_location import DatasetLocation, resolve_location
from .dataset_reader import INFO_PATH, read_info_json
from .distributed import usable_cpus
from .episode_data_files import episode_data_path, video_file_path
from .episode_table import read_episode_records, read_episode_table
from .errors import DAMAGED_VIDEO_ADVICE, DatasetError, VideoDecodeError, cameras_hint, did_you_mean, listing_hint
from .frame_checks import damaged_frame_error, is_damaged
from .hub_cache_files import bulk_files_named, read_bulk_from_cache
from .new_folder import is_inside, refuse_inside_a_dataset, refuse_resumable_taken, write_resumable_folder
from .packet_index import PacketIndex, build_packet_index
from .parent_watch import exit_with_parent
from .progress_lines import progress_counter
from .thread_priority import kept_thread_priority
from .video_encoding import CODECS, check_bounded_int, encoder_settings
from .worker_start import log_like_trainer, package_log_level, skipping_main

__all__ = ["ReencodeReport", "VideoReencoded", "reencode_dataset"]

logger = logging.getLogger(__name__)

#: Seconds between a worker's progress lines on one file (INFO, as ``lerobot-dali reencode`` logs).
PROGRESS_EVERY_S = 30.0
#: In the unfinished copy: what it is a copy of (checked when a run resumes it), and the lock of the run writing it.
_PLAN = ".reencode-plan.json"
_LOCK = ".reencode-lock"
#: 8-bit 4:2:0 pixel formats, re-encoded as they are; others are converted to yuv420p, with a warning.
_PLANAR_420 = ("yuv420p", "yuvj420p")


@dataclass(frozen=True)
class VideoReencoded:
    """One re-encoded video file: what random access to it costs before and after."""

    path: str
    """Relative to the dataset root."""
    camera: str
    frames: int
    bytes_before: int
    bytes_after: int
    decoded_per_frame_before: float
    """Mean frames decoded to show one frame, from the keyframe before it (1.0: every frame a keyframe)."""
    decoded_per_frame_after: float
    seconds: float
    resumed: bool = False
    """Re-encoded (and checked) by an earlier run that did not finish; this one checked it again."""


@dataclass(frozen=True)
class ReencodeReport:
    """What :func:`reencode_dataset` wrote."""

    out: Path
    codec: str
    gop: int
    videos: tuple[VideoReencoded, ...]
    kept_videos: tuple[str, ...]
    """Videos copied unchanged: depth maps, and cameras left out by ``cameras``."""
    kept_cameras: tuple[str, ...]
    """The cameras of ``kept_videos``."""
    copied_files: int
    """Files copied byte for byte, ``kept_videos`` included (info.json too, unless a codec in it changed)."""


@dataclass(frozen=True)
class _Job:
    source: str
    filesystem: Any | None
    target: str
    relative: str
    camera: str
    codec: str
    gop: int
    crf: int | None
    threads: int


def reencode_dataset(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    codec: str = "h264",
    gop: int = 2,
    crf: int | None = None,
    cameras: Sequence[str] | None = None,
    jobs: int | None = None,
    revision: str | None = None,
    progress: bool = False,
) -> ReencodeReport:
    """Write a copy of dataset ``source`` (a local folder, Hub repo id or fsspec URL) to the new folder ``out``,
    its colour videos re-encoded in ``codec`` with keyframes at most ``gop`` frames apart (see the module
    docstring).

    ``cameras`` limits the re-encode to those video keys (the rest are copied). ``jobs`` is how many files
    encode at once (default: one per CPU, at most one per file). ``out`` appears only once every file is written and
    checked. Until then the copy is written to ``.<out name>.partial`` beside it, which a failed or interrupted run
    leaves: the same call again keeps the videos re-encoded there and does the rest; a call with other options or
    another source is refused until that folder is deleted, as is a folder there that holds files of other work.
    Raises ValueError for bad options, an ``out`` that is a mount point (write into a new folder inside it) or a
    codec whose encoder refuses a video's frames (an odd size in H.264), FileExistsError for an ``out`` that is not
    new or empty (or such a folder), and VideoDecodeError naming the file when a video does not decode or its
    re-encode does not keep every timestamp.
    """
    encoder_settings(codec, gop=gop, crf=crf)  # (checks the codec, gop and crf before any work)
    if jobs is not None:
        check_bounded_int("jobs", jobs, 1)
    refuse_resumable_taken(out, writer="reencode")  # (before the source is listed and read, which may be remote)
    location = resolve_location(source, revision=revision)
    _refuse_out_inside(location, out)
    refuse_inside_a_dataset(out, writer="reencode")  # (another local dataset: the copy uploaded with it)
    raw_info = read_info_json(location)
    info = DatasetInfo.from_json(raw_info, source=location.meta_path(INFO_PATH))
    chosen = _chosen_cameras(info, cameras)
    location = _read_from_hub_cache(location, info)
    sizes = _listed_files(location)
    files = sorted(sizes)
    videos = _camera_videos(files, info)
    encode = sorted(relative for relative, camera in videos.items() if camera in chosen)
    if not encode:
        raise DatasetError(
            f"{location.description}: no video file of {sorted(chosen)} found under videos/; nothing to re-encode"
            f"{listing_hint(location.fs)}"
        )
    _warn_missing_files(location, info, chosen, set(files))
    encoded = set(encode)
    kept = tuple(sorted(set(videos) - encoded))
    cpus = usable_cpus()
    workers = min(jobs or cpus, len(encode))
    threads = max(1, cpus // workers)
    new_info = _with_codec(raw_info, chosen, codec)
    rewritten = [INFO_PATH] if new_info != raw_info and INFO_PATH in sizes else []
    logger.info(
        "re-encoding %d video file(s) of %s to %s GOP %d (%d at once); copying %d other file(s)%s",
        len(encode), location.description, codec, gop, workers, len(files) - len(encode) - len(rewritten),
        f", writing {INFO_PATH} with the new codec" if rewritten else "",
    )  # fmt: skip
    done: list[VideoReencoded] = []
    copied: list[str] = []
    plan = {
        "source": location.description, "revision": revision, "codec": codec, "gop": gop, "crf": crf,
        "cameras": sorted(chosen), "files": sizes,
    }  # fmt: skip

    def write(folder: Path) -> None:
        with _resumable(folder, plan):
            filesystem = None if location.is_local else location.fs
            job_list = [
                _Job(location.path(r), filesystem, str(folder / r), r, videos[r], codec, gop, crf, threads)
                for r in encode
            ]
            for relative in files:
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            done.extend(_run_jobs(job_list, workers, progress=progress))
            for relative in files:
                if relative in rewritten:
                    (folder / relative).write_text(json.dumps(new_info, indent=4) + "\n", encoding="utf-8")
                elif relative not in encoded:  # (kept videos too)
                    location.fs.get_file(location.path(relative), str(folder / relative))
                    copied.append(relative)

    root = write_resumable_folder(out, write, writer="reencode", bookkeeping=(_PLAN, _LOCK))
    return ReencodeReport(
        out=root,
        codec=codec,
        gop=gop,
        videos=tuple(sorted(done, key=lambda v: v.path)),
        kept_videos=kept,
        kept_cameras=tuple(sorted({videos[relative] for relative in kept})),
        copied_files=len(copied),
    )


def _warn_missing_files(location: DatasetLocation, info: DatasetInfo, cameras: set[str], listed: set[str]) -> None:
    """Warn of the data files, and videos of ``cameras``, the episode metadata names that the source lacks: the
    copy lacks them too, and was made without a word. Where videos are missing, the advice names the cameras to read
    without them (``gr00t_v20_h264``'s declared ``egoview`` has no file at all: leaving out its episodes leaves
    none). Metadata that does not read is left to the loader, which names what is wrong."""
    try:
        records = read_episode_records(location.meta_fs, location.meta_root, info)
        table = read_episode_table(records, info, video_keys=sorted(cameras))  # (no start read: none checked)
    except DatasetError as e:
        logger.debug("%s: episode metadata not read (%s); missing files not looked for", location.description, e)
        return
    episodes = range(len(table.length))
    named = {episode_data_path(info, table, pos) for pos in episodes}
    videos = {(c, video_file_path(info, table.cameras[c], pos, c)) for c in cameras for pos in episodes}
    missing_videos = {(camera, path) for camera, path in videos if path not in listed}
    missing = sorted((named - listed) | {path for _, path in missing_videos})
    if missing:
        lacking = {camera for camera, _ in missing_videos}
        kept = [key for key in info.camera_keys if key not in lacking]
        without = f"; or read without their cameras: {cameras_hint(kept)}" if lacking else ""
        logger.warning(
            "%s: %d file(s) the episode metadata names do not exist (%s): the copy lacks them too, and loading "
            "their episodes fails; restore them in the source and re-encode, or leave those episodes out%s",
            location.description, len(missing), _first_few(missing), without,
        )  # fmt: skip


def _refuse_out_inside(location: DatasetLocation, out: str | os.PathLike[str]) -> None:
    """ValueError for an ``out`` inside the local source, symbolic links followed (a link to the source, or in
    it, made the copy and its ``.partial`` folder land in the source)."""
    if location.is_local and is_inside(out, location.root):
        raise ValueError(f"out ({out}) is inside the source dataset {location.root}; write the copy elsewhere")


def _chosen_cameras(info: DatasetInfo, cameras: Sequence[str] | None) -> set[str]:
    colour = [key for key in info.video_keys if not info.features[key].is_depth_map]
    if cameras is None:
        return set(colour)
    if isinstance(cameras, str):
        raise ValueError(f"cameras must be a list of video keys, got the string {cameras!r}")
    unknown = sorted(set(cameras) - set(info.video_keys))
    if unknown:
        raise ValueError(
            f"cameras {unknown} are not video features of this dataset; it has {info.video_keys}"
            f"{did_you_mean(unknown, list(info.video_keys))}: pass cameras= from those (on the command line --cameras)"
        )
    depth = sorted(set(cameras) - set(colour))
    if depth:
        raise ValueError(f"cameras {depth} are depth maps, which a lossy re-encode would change; leave them out")
    return set(cameras)


def _read_from_hub_cache(location: DatasetLocation, info: DatasetInfo) -> DatasetLocation:
    """``location`` reading a Hub dataset's files from huggingface_hub's cache where it holds every one its episode
    metadata names, as :func:`~lerobot_dali.dataset_reader.open_dataset` does (with ``HF_HUB_OFFLINE``: or refused,
    naming those absent), and every other file its snapshot folder lists, which are copied too (a link whose blob is
    gone raised FileNotFoundError once every video was re-encoded); other locations as they are."""
    snapshot = location.hub_snapshot
    if snapshot is None:
        return read_bulk_from_cache(location, ())
    records = read_episode_records(location.meta_fs, location.meta_root, info)
    # (whole files are copied, no episode's start read, so none is checked)
    table = read_episode_table(records, info, video_keys=info.video_keys)
    named = dict.fromkeys(bulk_files_named(info, table, info.video_keys, None))
    others = (relative for relative in _links_without_blob(snapshot.folder) if relative not in named)
    return read_bulk_from_cache(location, itertools.chain(named, others))


def _links_without_blob(folder: str) -> Iterator[str]:
    """The files of snapshot ``folder`` (relative, as :func:`_listed_files` names them) that are links whose blob
    is gone."""
    for top, folders, names in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]  # (not part of the dataset)
        for name in names:
            if not os.path.exists(os.path.join(top, name)):
                yield os.path.relpath(os.path.join(top, name), folder).replace(os.sep, "/")


def _listed_files(location: DatasetLocation) -> dict[str, int | None]:
    """Every file of the dataset, relative to its root, with its size where the listing says; folders whose names
    start with "." (``.cache``, ``.git``) are not part of it."""
    root = location.root.rstrip("/")
    found = location.fs.find(root, detail=True)
    stray = next((path for path in found if not path.startswith(f"{root}/")), None)
    if stray is not None:  # (a filesystem that lists in another spelling than its root's)
        raise DatasetError(f"{location.description}: listing {root} gave {stray}, which is not under it")
    sizes = {path[len(root) + 1 :]: entry.get("size") for path, entry in found.items()}
    return {r: size for r, size in sorted(sizes.items()) if not any(p.startswith(".") for p in r.split("/")[:-1])}


@contextlib.contextmanager
def _resumable(folder: Path, plan: dict[str, Any]) -> Iterator[None]:
    """Hold ``folder`` for this run alone and check that what an earlier run left there is this run's work: the
    same source files (sizes), options and cameras. On failure, say what is kept; on success, the plan and lock
    files stay until the folder is renamed to ``out`` (:func:`~lerobot_dali.new_folder.write_resumable_folder`)."""
    lock, locked = try_flock_where_supported(folder / _LOCK)
    if lock is None:
        raise FileExistsError(f"{folder}: another lerobot-dali reencode is writing there; wait for it, or stop it")
    if not locked:
        logger.warning(
            "%s: its filesystem takes no file locks (NFS without its lock daemon, Lustre without -o flock), so nothing "
            "stops a second reencode into it at once from mixing its files with this one's: run one at a time", folder,
        )  # fmt: skip
    with lock:
        plan_file = folder / _PLAN
        if plan_file.exists():
            earlier = json.loads(plan_file.read_text(encoding="utf-8"))
            if earlier != json.loads(json.dumps(plan)):
                raise _other_plan_error(folder, earlier, json.loads(json.dumps(plan)))
            logger.info("resuming the unfinished re-encode in %s", folder)
        elif any(entry.name != _LOCK for entry in folder.iterdir()):  # (the plan is written before any file)
            raise FileExistsError(
                f"{folder} holds files but no re-encode plan: it is not an unfinished re-encode's; delete the folder"
            )
        else:
            with atomic_file(plan_file, prefix=_PLAN) as f:  # (a crash never leaves half a plan)
                f.write(json.dumps(plan).encode())
        try:
            yield
        except BaseException:
            finished = sum(1 for p in folder.rglob("*.mp4") if p.is_file())
            logger.warning(
                "re-encode stopped: %d video(s) finished are kept in %s; the same command resumes there", finished,
                folder,
            )  # fmt: skip
            raise


def _other_plan_error(folder: Path, earlier: dict[str, Any], plan: dict[str, Any]) -> FileExistsError:
    """The error for a ``folder`` holding another re-encode's work, saying what differs. (A source file mended
    since, of another size, was told to run the same command again, which was refused the same way.)"""
    options = [f"{k} {earlier.get(k)!r} -> {plan.get(k)!r}" for k in plan if k != "files" and earlier.get(k) != plan[k]]
    if options:
        return FileExistsError(
            f"{folder} holds an unfinished re-encode of {earlier.get('source')} with other options, cameras or "
            f"source ({'; '.join(options)}): run that command again to finish it, or delete the folder"
        )
    before, now = earlier.get("files") or {}, plan["files"]
    changed = sorted(set(before) ^ set(now) | {r for r in set(before) & set(now) if before[r] != now[r]})
    return FileExistsError(
        f"{folder} holds an unfinished re-encode of {earlier.get('source')} whose files have changed since it "
        f"started (added, removed or resized: {_first_few(changed)}): its videos may be of the old files; delete "
        "the folder to start over"
    )


def _first_few(paths: Sequence[str]) -> str:
    """The first three of ``paths``, and how many more, for a message."""
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _camera_videos(files: Sequence[str], info: DatasetInfo) -> dict[str, str]:
    """The video files among ``files`` (relative paths), each with its camera: the names info.json's ``video_path``
    gives a video key (v2.x puts the key after the chunk folder, v3.0 before)."""
    if info.video_path is None:
        return {}
    matcher = re.compile(template_pattern(info.video_path, {"video_key": r"[^/]+"}))
    matches = ((relative, matcher.fullmatch(relative)) for relative in files)
    return {r: m["video_key"] for r, m in matches if m is not None and m["video_key"] in info.video_keys}


def _with_codec(raw_info: dict[str, Any], cameras: set[str], codec: str) -> dict[str, Any]:
    """``raw_info`` with ``video.codec`` of ``cameras`` as re-encoded (and ``video.pix_fmt`` 8-bit 4:2:0, no audio)."""
    out = json.loads(json.dumps(raw_info))
    encoder = encoder_settings(codec, gop=1).encoder
    for key in cameras:
        for name in ("info", "video_info"):  # ('video_info': v2.0)
            video = out["features"][key].get(name)
            if isinstance(video, dict):
                if "video.codec" in video:
                    video["video.codec"] = codec
                if video.get("video.pix_fmt") is not None:
                    video["video.pix_fmt"] = _encoded_pix_fmt(video["video.pix_fmt"], encoder)
                if "has_audio" in video:
                    video["has_audio"] = False
    return out


def _run_jobs(jobs: list[_Job], workers: int, *, progress: bool) -> list[VideoReencoded]:
    """Each job's result, from ``workers`` spawned processes. No more jobs are handed out than there are workers,
    so a failure or Ctrl-C waits for the files in progress at most, never for queued ones."""
    done = []
    queued = iter(jobs)
    # Spawned: FFmpeg's threads and the caller's (DALI, torch) never cross a fork.
    context = multiprocessing.get_context("spawn")
    with (
        concurrent.futures.ProcessPoolExecutor(
            workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(min(package_log_level(), logger.getEffectiveLevel()),),
        ) as pool,
        progress_counter(  # (each file's line below is its progress where no bar is drawn)
            len(jobs), desc="lerobot-dali reencode", unit="video", logger=logger, enabled=progress
        ) as encoded,
    ):
        with skipping_main(_reencode_file):  # (the pool starts its processes at these submits, in this thread)
            running = {pool.submit(_reencode_file, job) for job in itertools.islice(queued, workers)}
        while running:
            finished, running = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                video = future.result()
                logger.info(
                    "%s: %d frames, %.1f -> %.1f frames decoded per frame, %.1f -> %.1f MB, %.1f s%s",
                    video.path, video.frames, video.decoded_per_frame_before, video.decoded_per_frame_after,
                    video.bytes_before / 1e6, video.bytes_after / 1e6, video.seconds,
                    " (re-encoded by an earlier run)" if video.resumed else "",
                )  # fmt: skip
                done.append(video)
                encoded(1)
            running |= {pool.submit(_reencode_file, job) for job in itertools.islice(queued, len(finished))}
    return done


def _start_worker(level: int) -> None:
    """In each worker: log as this process does, and exit once it is gone. A worker whose parent was killed
    (SIGTERM, the out-of-memory killer) otherwise finished its file and then waited forever, reparented to init;
    meanwhile a re-run, its lock free, wrote the same file beside it."""
    log_like_trainer(level)
    exit_with_parent()


def _reencode_file(job: _Job) -> VideoReencoded:
    """Re-encode one video (in a worker process) and check that every frame kept its timestamp. The target appears
    only once checked (and flushed to disk), so one that exists is an earlier run's finished work: it is checked
    again, not redone, unless it no longer checks (cut short by a power loss or a full disk), when it is redone."""
    started = time.perf_counter()
    before = build_packet_index(job.source, filesystem=job.filesystem)
    target = Path(job.target)
    after = _finished_copy(target, before) if target.exists() else None
    resumed = after is not None
    if after is None:
        unfinished = target.with_name(target.name + ".unfinished")
        handle = job.filesystem.open(job.source, "rb") if job.filesystem is not None else None
        try:
            with av.open(handle if handle is not None else job.source, "r") as source:
                _encode(source, job, unfinished, before)
        except (av.error.FFmpegError, OSError) as e:
            raise _reencode_failed(job, before.source_name, e) from e
        finally:
            if handle is not None:
                handle.close()
        after = build_packet_index(unfinished)
        _check_same_frames(before, after)
        with open(unfinished, "rb+") as written:  # (on disk before it is named finished: a crash keeps no stub)
            os.fsync(written.fileno())
        os.replace(unfinished, target)
    return VideoReencoded(
        path=job.relative,
        camera=job.camera,
        frames=len(after.shown_pts),
        bytes_before=before.file_size_bytes,
        bytes_after=after.file_size_bytes,
        decoded_per_frame_before=decoded_per_frame(before),
        decoded_per_frame_after=decoded_per_frame(after),
        seconds=time.perf_counter() - started,
        resumed=resumed,
    )


def _reencode_failed(job: _Job, label: str, error: Exception) -> VideoDecodeError:
    """The error for a re-encode that failed with ``error``: the source is decoded alone to tell whose fault it is,
    the file's (it does not decode either) or the encoder's or the disk's (it does)."""
    try:
        try:
            opener = job.filesystem.open if job.filesystem is not None else open
            handle = opener(job.source, "rb")  # (closed by the with below)
        except OSError as e:  # (gone, unreadable or unreachable since: raised here, it hid the failure; a local
            # one's was taken for a decode failure and called corrupt)
            return VideoDecodeError(
                f"{label}: re-encoding failed ({error}), and the file cannot be opened again ({e!r}): check that it "
                "is still there, readable and reachable, then run the re-encode again (it resumes)"
            )
        with handle, av.open(handle, "r") as source:
            for _ in source.decode(source.streams.video[0]):
                pass
    except (av.error.FFmpegError, OSError) as e:
        return VideoDecodeError(
            f"{label}: re-encoding failed ({error}), and decoding the file alone fails too ({e}): the file is corrupt "
            f"or truncated: {DAMAGED_VIDEO_ADVICE}, or leave its camera out of the re-encode ({cameras_hint()}; its "
            "videos are then copied as they are)"
        )
    except Exception as e:  # (the check's own failure: the re-encode's is still the one to tell)
        return VideoDecodeError(
            f"{label}: re-encoding failed ({error}); decoding the file alone, to tell whether the file is at fault, "
            f"failed too ({e!r})"
        )
    return VideoDecodeError(
        f"{label}: re-encoding failed ({error}), though the file decodes alone: the fault is the {job.codec} "
        f"encoder's or writing the copy's, not the file's: check that the disk holding the copy has room, or "
        f"re-encode in another codec (codec= one of {list(CODECS)}; on the command line --codec) or at another "
        "crf (crf=, --crf)"
    )


def _finished_copy(target: Path, before: PacketIndex) -> PacketIndex | None:
    """The packet index of ``target``, an earlier run's finished copy of the video ``before`` indexes, if it still
    holds every frame of it; else None, with a warning, and the file is removed to be encoded again."""
    try:
        after = build_packet_index(target)
        _check_same_frames(before, after)
    except VideoDecodeError as e:
        logger.warning("%s: its copy from an earlier run does not check (%s); encoding it again", target, e)
        target.unlink()
        return None
    return after


def _encode(source: Any, job: _Job, path: Path, index: PacketIndex) -> None:
    """Encode ``source``'s frames (``index`` is its packet index) into ``path``, refusing a damaged one as the loader
    does (:func:`~lerobot_dali.frame_checks.is_damaged`): the encoder would scale a 1x1 frame of a damaged header to
    the stream's size, and the copy would then hide the damage."""
    label, frames = index.source_name, len(index.shown_pts)
    stream = source.streams.video[0]
    if source.streams.audio:
        logger.warning("%s: its audio is not copied (LeRobot reads video alone)", label)
    stream.thread_type = "AUTO"
    stream.codec_context.thread_count = job.threads
    decoder = stream.codec_context
    settings = encoder_settings(job.codec, gop=job.gop, crf=job.crf, b_frames=False)
    pix_fmt = _encoded_pix_fmt(decoder.pix_fmt, settings.encoder)
    if decoder.pix_fmt not in _PLANAR_420:
        logger.warning("%s: %s converted to yuv420p (8-bit 4:2:0) for the re-encode", label, decoder.pix_fmt)
    rate = stream.average_rate or stream.guessed_rate or Fraction(30)
    with av.open(str(path), "w", format="mp4") as target:
        out = target.add_stream(settings.encoder, rate=rate)
        out.width, out.height, out.pix_fmt = decoder.width, decoder.height, pix_fmt
        out.codec_context.time_base = out.time_base = stream.time_base
        for tag in ("colorspace", "color_range", "color_primaries", "color_trc"):
            setattr(out.codec_context, tag, getattr(decoder, tag))
        out.codec_context.thread_count = job.threads
        out.options = settings.options
        try:
            with kept_thread_priority():  # (SVT-AV1, run as root, left this thread real-time)
                out.codec_context.open()
        except av.error.FFmpegError as e:  # (not the file's fault: it would be named corrupt)
            raise _encoder_refused(label, settings.encoder, decoder.width, decoder.height, pix_fmt, e) from e
        said = time.monotonic()
        for done, frame in enumerate(source.decode(stream)):
            if time.monotonic() - said >= PROGRESS_EVERY_S:  # a long file says how far it got
                said = time.monotonic()
                logger.info("%s: %d of %d frames re-encoded", label, done, frames)
            if is_damaged(frame, index):
                raise damaged_frame_error(label, frame, index, frame.time)
            if frame.pts is None:
                raise VideoDecodeError(f"{label}: a decoded frame has no timestamp; it cannot keep its place.")
            frame.pict_type = av.video.frame.PictureType.NONE  # (the source's keyframes are not forced)
            target.mux(out.encode(frame))
        target.mux(out.encode(None))


def _encoder_refused(label: str, encoder: str, width: int, height: int, pix_fmt: str, error: Exception) -> ValueError:
    """The error for an encoder that does not open for a video's frames (libx264 and libx265 take no odd size)."""
    odd = " (H.264 and HEVC take no odd width or height; AV1 and VP9 do)" if width % 2 or height % 2 else ""
    return ValueError(
        f"{label}: the {encoder} encoder refused its {width}x{height} {pix_fmt} frames ({error}){odd}; the file "
        "itself is fine: re-encode the dataset in another codec (codec=, on the command line --codec)"
    )


def _encoded_pix_fmt(pix_fmt: str, encoder: str) -> str:
    """The pixel format ``encoder`` writes frames of ``pix_fmt`` in: 8-bit 4:2:0 as it is where the encoder takes
    it, else yuv420p. (yuvj420p, full-range 4:2:0, was handed to libvpx-vp9 and libsvtav1 as it was, and they
    refused it; in yuv420p the full range goes with the stream's colour range, copied from the source's.)"""
    if pix_fmt in _PLANAR_420 and pix_fmt in {f.name for f in av.codec.Codec(encoder, "w").video_formats or ()}:
        return pix_fmt
    return "yuv420p"


def _check_same_frames(before: PacketIndex, after: PacketIndex) -> None:
    """Every frame a decode of ``before`` shows at the same instant in ``after``, and no other, as the loader finds
    frames (exact rationals). The frames ``before``'s edit list hides (:attr:`~.packet_index.PacketIndex.hidden`:
    those before its start, as in a stream copy cut from a longer recording, or after its end) FFmpeg decodes as
    references without showing them, so no route reads them and the copy holds none."""

    def instants(index: PacketIndex) -> list[Fraction]:
        return [p * index.time_base for p in index.shown_pts.tolist()]

    shown = instants(before)
    if shown != instants(after):
        raise VideoDecodeError(
            f"{before.source_name}: the re-encode holds {len(after.shown_pts)} frames, the source shows "
            f"{len(shown)}, or some frame moved in time; it was not kept"
        )
    hidden = before.frame_count - len(shown)
    if hidden:
        logger.info(
            "%s: %d frame(s) its edit list hides are never shown and are left out of the copy",
            before.source_name, hidden,
        )  # fmt: skip


def decoded_per_frame(index: PacketIndex) -> float:
    """Mean frames decoded to show one frame of ``index`` by itself (:func:`~lerobot_dali.clips.plan_clip`), of those
    a decode shows."""
    counts = [plan_clip(index, np.array([i])).frame_count for i in index.shown]
    return float(np.mean(counts))
