"""The report of ``lerobot-dali bench``: ``bench.json``, ``bench.csv``, ``bench.png`` and the text table the
CLI prints."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bench_types import _EXTERNAL, METRIC_FIELDS, LoaderResult
from .cache_dirs import write_whole
from .video_encoding import LONG_GOP_FRAMES

__all__ = ["BenchReport", "format_table", "write_report"]

logger = logging.getLogger(__name__)


#: Mean frames decoded per frame shown at the keyframe spacing ``info`` calls long.
_LONG_GOP_DECODES = (LONG_GOP_FRAMES + 1) / 2


@dataclass(frozen=True)
class BenchReport:
    config: dict[str, Any]
    machine: dict[str, Any]
    datasets: list[dict[str, Any]]
    results: tuple[LoaderResult, ...]
    notes: tuple[str, ...]
    out_dir: Path
    files: dict[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        """Why the run failed (empty: it did not): a loader that ran and measured no frame, or an error in
        lerobot-dali or the plain peer, or decode ceilings asked for (``--limits``) and not measured, or no
        frame measured at all (every loader skipped or failed). An error inside LeRobot alone is reported,
        not counted: it is not ours."""
        failed = [
            f"{r.dataset} / {r.loader}: {r.note}"
            for r in self.results
            if r.status == "zero-frames" or (r.status == "error" and r.loader not in _EXTERNAL)
        ]
        unmeasured = [d for d in self.datasets if "ceilings_error" in d]
        failed += [f"{d['label']} / decode ceilings: {d['ceilings_error']}" for d in unmeasured]
        if not any(r.status == "ok" and r.frames > 0 for r in self.results):
            statuses = sorted({r.status for r in self.results})
            failed.append(f"no loader measured any frame (statuses: {', '.join(statuses) or 'no loader ran'})")
        return failed

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failures": self.failures,
            "config": self.config,
            "machine": self.machine,
            "datasets": self.datasets,
            "results": [dataclasses.asdict(r) for r in self.results],
            "notes": list(self.notes),
            "files": self.files,
        }


def write_report(report: BenchReport, out_dir: Path, notes: list[str]) -> dict[str, str]:
    """``bench.json``, ``bench.csv`` and ``bench.png`` (when matplotlib imports) in ``out_dir``, each whole or not at
    all (:func:`~.cache_dirs.write_whole`), ``bench.json`` last: written in place, a bench killed mid-write (or a value
    JSON cannot hold) left a file cut short, or last run's beside this one's, that a later comparison read."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out_dir / "bench.json"), "csv": str(out_dir / "bench.csv")}
    rows = io.StringIO()
    writer = csv.DictWriter(rows, fieldnames=list(METRIC_FIELDS))
    writer.writeheader()
    for r in report.results:
        writer.writerow(dataclasses.asdict(r))
    write_whole(out_dir / "bench.csv", rows.getvalue().encode())
    try:
        files["png"] = str(_plot(report, out_dir / "bench.png"))
    except ImportError:
        notes.append("matplotlib is not installed: no bench.png (pip install matplotlib)")
        logger.warning(notes[-1])
    final = dataclasses.replace(report, files=files, notes=tuple(notes))
    write_whole(out_dir / "bench.json", json.dumps(final.to_dict(), indent=2).encode())
    return files


def _plot(report: BenchReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in report.results if r.status != "skipped"]
    datasets = list(dict.fromkeys(r.dataset for r in shown))
    loaders = list(dict.fromkeys(r.loader for r in shown))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(datasets) * max(1, len(loaders)) / 2), 4.5))
    width = 0.8 / max(1, len(loaders))
    for j, loader in enumerate(loaders):
        values = []
        for d in datasets:
            match = [r for r in shown if r.dataset == d and r.loader == loader]
            values.append(match[0].frames_per_s if match and match[0].status == "ok" else 0.0)
        xs = [i + (j - (len(loaders) - 1) / 2) * width for i in range(len(datasets))]
        bars = ax.bar(xs, values, width, label=loader)
        ax.bar_label(bars, labels=[f"{v:.0f}" if v else "n/a" for v in values], fontsize=7)
    ax.set_xticks(range(len(datasets)), [d.replace("_", "\n", 1) for d in datasets], fontsize=8)
    ax.set_ylabel("frames / s (steady window)")
    config = report.config
    ax.set_title(
        f"{config['mode']} mode, batch {config['batch_size']}, {config['num_workers']} workers, "
        f"device {report.machine['device']}",
        fontsize=9,
    )
    if loaders:  # none when every loader was skipped
        ax.legend(fontsize=8)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_whole(path, image.getvalue())
    return path


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _spread(result: LoaderResult) -> str:
    """``2.41-2.95 x3``: the lowest and highest of a loader's per-run ratios to the best peer, and the runs."""
    if result.vs_best_peer_runs is None:
        return "-"
    ratios = [float(x) for x in result.vs_best_peer_runs.split()]
    return f"{min(ratios):.2f}-{max(ratios):.2f} x{len(ratios)}"


def _route(routes: str) -> str:
    """``cam0=nvdec cam1=nvdec`` as ``nvdec``; cameras on different routes stay named."""
    distinct = {pair.partition("=")[2] for pair in routes.split()}
    return "-" if not routes else distinct.pop() if len(distinct) == 1 else routes


def _camera_windows(summary: dict[str, Any]) -> bool:
    cameras = {*summary.get("cameras", ()), *summary.get("image_cameras", ())}
    return bool(cameras & set(summary.get("delta_timestamps") or {}))


def format_table(report: BenchReport) -> str:
    """The results as an aligned text table (what the CLI prints), then what the ratios divide by.

    Codec and route stand in every row, so an NVDEC H.264 number is never read as an AV1 CPU-fallback one."""
    codecs = {d["label"]: str(d.get("codec", "-")) for d in report.datasets}
    header: tuple[str, ...] = (
        "dataset", "codec", "loader", "route", "frames/s", "samples/s", "vs peer", "of ceil", "first s", "p50 ms",
        "p95 ms", "p99 ms", "RSS MB", "PSS MB", "GPU MB", "eps/batch", "clip/file", "status",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for r in report.results:
        gpu = r.gpu_peak_used_mb if r.gpu_peak_used_mb is not None else r.gpu_max_allocated_mb
        measured = r.status == "ok"
        rows.append((
            r.dataset, codecs.get(r.dataset, "-"), r.loader, _route(r.routes),
            _fmt(r.frames_per_s if measured else None, ".1f"),
            _fmt(r.samples_per_s if measured else None, ".1f"),
            _fmt(r.vs_best_peer, ".2f"), _fmt(r.fraction_of_decode_ceiling, ".2f"), _fmt(r.first_batch_s, ".2f"),
            _fmt(r.batch_p50_ms, ".0f"), _fmt(r.batch_p95_ms, ".0f"), _fmt(r.batch_p99_ms, ".0f"),
            _fmt(r.peak_rss_mb, ".0f"), _fmt(r.peak_pss_mb, ".0f"), _fmt(gpu, ".0f"), _fmt(r.episodes_per_batch, ".1f"),
            _fmt(r.clip_to_file_ratio, ".4f"), r.status if r.status == "ok" else f"{r.status}: {r.note[:60]}",
        ))  # fmt: skip
    if any(r.repeats > 1 for r in report.results):  # the spread of the ratio over the runs, after the median
        at = header.index("vs peer") + 1
        spreads = ["runs", *(_spread(r) for r in report.results)]
        rows = [(*row[:at], spread, *row[at:]) for row, spread in zip(rows, spreads, strict=True)]
        header = rows[0]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    divisors = dict.fromkeys(f"{r.dataset}: {r.best_peer}" for r in report.results if r.best_peer)
    if divisors:
        lines.append(f"vs peer: frames/s over the fastest loader that is not lerobot-dali ({'; '.join(divisors)}).")
    if "runs" in header:
        lines.append("runs (--repeats): the row is the median run; vs peer the median of the runs' ratios, each to its")
        lines.append("own round's fastest peer; runs their lowest-highest and count.")
    if any(r.fraction_of_decode_ceiling is not None for r in report.results):
        lines.append("of ceil: frames/s over the best decode ceiling of the same files (--limits).")
    decoded = [f"{d['label']}: {d['decoded_frames_per_frame']:.2f}" for d in report.datasets
               if d.get("decoded_frames_per_frame") is not None]  # fmt: skip
    if decoded:
        lines.append(f"decoded/frame: frames decoded per frame shown, from its keyframe on ({'; '.join(decoded)}).")
    long_gop = [d["label"] for d in report.datasets if (d.get("decoded_frames_per_frame") or 0) > _LONG_GOP_DECODES]
    if long_gop:
        lines.append(
            f"{', '.join(long_gop)}: keyframes far apart; a copy re-encoded at GOP 2 (lerobot-dali reencode DATASET "
            "OUT) decodes about 1.5 frames per frame."
        )
    if any(_camera_windows(d) for d in report.datasets):
        lines.append("frames: camera images handed over; a window's padded and repeated ones count, for every loader.")
    return "\n".join(lines)
