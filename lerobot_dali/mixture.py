"""``DALILeRobotMixture``: one stream of batches over several LeRobot datasets, every batch a fixed mix of them.

Each dataset is read by its own :class:`~lerobot_dali.iterator.DALILeRobotIterator` (its own pipeline, workers,
decode routes, fps and rank sharding) at a fixed share of the batch; a mixture batch joins one part of each.
Fixed shares keep the weights in every batch, not only on average, and keep resume exact: the mixture's state
is its datasets' states.

Epochs: a mixture epoch is one epoch of its *anchor*, the dataset that takes the most batches to be read once
at its share (with the default weights, which follow the frame counts, every dataset takes about as many).
Each other dataset runs through its own epochs as often as that takes, one after another across the mixture's
epochs (:mod:`.part_schedule`): its pipeline runs on when a mixture epoch starts, its samples come equally often,
and where it stands at the start of mixture epoch ``e`` is a pure function of ``e``, so ``set_epoch`` may jump.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from . import fork_locks
from .concurrent_calls import in_threads
from .dataset_info import INDEX_COLUMNS
from .dataset_reader import LeRobotDatasetReader
from .dataset_union import (
    DATASET_IDENTITIES,
    DATASET_INDEX,
    Dataset,
    dataset_contents,
    dataset_identities,
    dataset_list,
    open_all,
    refuse_another_order,
    refuse_dataset_index_feature,
)
from .episode_pieces import EpisodePieces
from .errors import (
    DatasetError,
    DeltaTimestampsError,
    IteratorClosedError,
    ResumeStateError,
    SchemaMismatchError,
    ShardingError,
)
from .iterator import (
    DALILeRobotIterator,
    builds_said_together,
    close_deadline,
    default_dali_threads,
    wait_for_pass,
    warn_of_another_seed,
)
from .key_rename import KeyRename, rename_hint, shared_selection, without_cameras_left_out
from .mixture_options import MixtureOptions
from .part_schedule import PartSchedule
from .said_once import say_once, warn_once
from .sample_order import RankBalance
from .value_checks import check_choice, check_int, is_number

# (at run time too: typing.get_type_hints of the constructor, which CLI builders and run-time type checkers read)
if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # (typing_extensions: declared for Python 3.10 in pyproject.toml)
    from typing_extensions import Unpack

__all__ = ["PER_DATASET_OPTIONS", "DALILeRobotMixture", "batch_shares", "shared_selection"]

logger = logging.getLogger(__name__)

#: Arguments the mixture sets itself for each dataset's iterator; the rest pass through unchanged.
_OWN_ARGUMENTS = frozenset({"dataset", "batch_size", "seed", "num_workers", "cameras", "keys", "drop_last"})
#: Arguments that open a dataset: give each dataset its own by passing it opened (``open_dataset``).
_OPENING_ARGUMENTS = frozenset({"revision", "episodes", "episode_filter", "data_files_root"})
#: Arguments ``dataset_options`` may set per dataset: how its own files are read and its samples drawn, which
#: datasets of other writers need differently (wall-clock parquet timestamps, a codec NVDEC lacks, long episodes).
PER_DATASET_OPTIONS = frozenset(
    {"timestamp_source", "tolerance_s", "decode", "cpu_decode", "augment", "episode_pool_size", "episode_piece_frames",
     "drop_n_first_frames", "drop_n_last_frames", "share_clips"}
)  # fmt: skip
#: Largest denominator of a weight taken as a fraction (:func:`_in_lowest_terms`): two such fractions differ by far
#: more than a float's last bit, so a weight's float gives back the very fraction it was typed or computed as.
_DENOMINATOR = 10**6
#: How close (relative) a weight's fraction must be to it to stand for it.
_CLOSE = 1e-9
#: Largest sum of weights in lowest terms taken as such: floats hold every integer up to it, so their ratios split a
#: batch alike however scaled; past it (80 weights of denominators near :data:`_DENOMINATOR`) they overflowed a float.
_EXACT = 2**53
#: The ``dataset_options`` key of a dataset's ``{own key: batch key}`` renames (:class:`~.key_rename.KeyRename`).
RENAME_MAP = "rename_map"


def batch_shares(weights: Sequence[float], total: int) -> tuple[int, ...]:
    """``total`` split in proportion to ``weights``, at least 1 each (largest remainders get the rest). Weights in one
    ratio split it alike, however scaled (:func:`_in_lowest_terms`)."""
    w = np.asarray([float(x) for x in weights])
    if len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"weights must be positive finite numbers, one per dataset, got {list(weights)}")
    if total < len(w):
        raise ValueError(f"{total} cannot be split into {len(w)} parts of at least 1")
    w = _in_lowest_terms(w)
    exact = w / w.sum() * total
    shares = np.maximum(np.floor(exact).astype(np.int64), 1)
    while shares.sum() < total:
        shares[np.argmax(exact - shares)] += 1
    while shares.sum() > total:  # (the minimum of 1 took from the others)
        over = np.where(shares > 1, shares - exact, -np.inf)
        shares[np.argmax(over)] -= 1
    return tuple(int(s) for s in shares)


def _warn_of_raised_shares(weights: Sequence[float], shares: Sequence[int], names: Sequence[str]) -> None:
    """Warn of each dataset whose share of a batch the minimum of 1 (:func:`batch_shares`) raised past its weight's,
    one that rounds to 0: weights 1 and 100 in a batch of 4 read the first dataset as 1 of 4 samples (25%), not 1%,
    said only by the mixture's INFO line of shares. The warning names the batch size from which its weight's share is
    a sample or more."""
    w = np.asarray([float(x) for x in weights])
    total = sum(shares)
    for name, weight, share in zip(names, w.tolist(), shares, strict=True):
        exact = weight / w.sum() * total
        if exact < 0.5 < share:  # (rounded, it would be 0)
            warn_once(logger,
                "the mixture's weights (its datasets' frames where none are given) give %s %.3g of each batch of %d "
                "(%.3g%%), but every dataset has at least 1 "
                "sample a batch: it gets %d (%.3g%%); a batch_size of %d or more holds it to its weight",
                name, exact, total, 100 * exact / total, share, 100 * share / total, math.ceil(w.sum() / weight),
            )  # fmt: skip


def _in_lowest_terms(weights: np.ndarray) -> np.ndarray:
    """``weights`` as the smallest integers in their ratio, where each, or each over the largest, is a fraction of
    denominator up to :data:`_DENOMINATOR` (``[1, 3]``, ``[0.25, 0.75]``, ``[0.1, 0.1 * 3]`` and ``[1e-8, 3e-8]``
    alike: ``[1, 3]``) and those integers sum to at most :data:`_EXACT`; else as they are.

    A share's floor and the largest remainder went by the last bit of each weight's float: weights in one ratio, scaled
    otherwise, split a batch otherwise (``[1, 3]`` into 6: 2 + 4, ``[0.1, 0.1 * 3]``: 1 + 5), and a state saved
    with one was refused, or resumed in other proportions, with the other. Integer weights (the default: frames
    sampled) split as before: their ratios are exact in floats however scaled. Weights below ``1 / _DENOMINATOR``
    (inverse frame counts) have no such fraction themselves: over the largest, they do."""
    for scaled in (weights, weights / weights.max()):
        fractions = [Fraction(x).limit_denominator(_DENOMINATOR) for x in scaled.tolist()]
        if any(f <= 0 or abs(f - x) > _CLOSE * x for f, x in zip(fractions, scaled.tolist(), strict=True)):
            continue  # (no such fractions: weights of very different magnitudes, or tiny ones)
        scale = math.lcm(*(f.denominator for f in fractions))
        integers = [int(f * scale) for f in fractions]
        divisor = math.gcd(*integers)
        lowest = [n // divisor for n in integers]
        if sum(lowest) <= _EXACT:  # (else many weights of large denominators: past what floats hold exactly, or at all)
            return np.asarray(lowest, dtype=np.float64)
    return weights


class DALILeRobotMixture:
    """Batches over several LeRobot datasets at once, each batch holding ``batch_shares(weights, batch_size)``
    samples of each dataset, in dataset order, with a ``dataset_index`` tensor saying whose each sample is.

    Batches carry the keys and cameras every dataset has (others are left out, with a warning, as LeRobot's
    ``MultiLeRobotDataset`` does); their shapes must agree (``image_size`` resizes every camera to one size).
    ``task_index``, ``index`` and ``episode_index`` are each dataset's own; ``task`` is its string.

    ``weights`` (default: each dataset's frames sampled, as reading their concatenation would) set the shares.
    ``num_workers`` is split over the datasets by share (at least one each). Every other argument of
    :class:`~lerobot_dali.iterator.DALILeRobotIterator` applies to every dataset (but ``drop_last``, refused: every
    mixture batch is full, and ``rank_balance='none'``), but ``dataset_options`` (one
    mapping per dataset) sets those of :data:`PER_DATASET_OPTIONS` for one dataset, e.g.
    ``[{"timestamp_source": "frame_index"}, {}]`` for a first dataset whose parquet timestamps are wall-clock.
    Its ``"rename_map"`` (LeRobot's ``rename_map``, ``{own key: batch key}``) gives a dataset's cameras or features
    the names the others have, e.g. ``{"observation.images.rgb": "observation.images.top"}``; every other argument
    (``cameras``, ``keys``, ``delta_timestamps``, a per-camera ``normalize``) names keys as the batches do; each
    dataset given by path is opened with only its own keys for ``cameras``, so one it declares but never recorded
    (GR00T v2.0's 'egoview') is not looked for.
    Arguments that open a dataset (``revision``, ``episodes``, ``episode_filter``, ``data_files_root``) are per
    dataset too: pass it opened with ``open_dataset``.
    Every batch is full: as with ``drop_last=True``, each dataset's epoch leaves out fewer samples than its share.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        *,
        weights: Sequence[float] | None = None,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 4,
        cameras: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        dataset_options: Sequence[Mapping[str, Any] | None] | None = None,
        **options: Unpack[MixtureOptions],
    ) -> None:
        #: Held while this thread starts the datasets' passes (builds their pipelines): see :meth:`close`.
        self._starting = fork_locks.rlock()
        self._closes = 0  # close() calls so far: a pass started after one is not closed by it
        #: Held to load a state (and count it, in ``_loads``) or to restore the states from before a failed batch:
        #: a batch failed by a load from another thread restores nothing (it would undo the load).
        self._loading = fork_locks.rlock()
        self._loads = 0
        _check_options(options)
        balance = options.get("rank_balance", RankBalance.PAD)  # (any case, as the iterator takes it: "NONE" too)
        if check_choice(RankBalance, "rank_balance", balance) is RankBalance.NONE:
            raise ValueError(
                "rank_balance='none' (ranks of unequal counts, for evaluation) reads one dataset or a union "
                "(concat_datasets), not a mixture, whose every batch holds a share of each dataset"
            )
        datasets = dataset_list(datasets)
        own_options = _per_dataset(dataset_options, len(datasets))
        batch_size = check_int("batch_size", batch_size, minimum=1)
        num_workers = check_int("num_workers", num_workers, minimum=0)
        seed = check_int("seed", seed, minimum=0)  # (an int: the state says it, and JSON takes no numpy integer)
        #: The seed the datasets' seeds derive from: a loaded state's where it says it, None where it does not and
        #: its datasets' seeds differ from this one's.
        self._seed: int | None = seed
        self._built_seed = seed
        rename_maps = [own.pop(RENAME_MAP, None) for own in own_options]
        readers = open_all(datasets, cameras=cameras, rename_maps=rename_maps)  # (each with its own keys for cameras)
        if cameras is not None:  # (entries for declared cameras that cameras= left out rename nothing)
            rename_maps = without_cameras_left_out(rename_maps, readers)
        self.renames = [
            KeyRename.checked(m, reader, cameras=cameras) for m, reader in zip(rename_maps, readers, strict=True)
        ]
        readers = shared_selection(readers, cameras=cameras, keys=keys, renames=self.renames)
        windows = options.get("delta_timestamps")
        _check_windows(readers, windows, self.renames, cameras=cameras, keys=keys)
        _check_shapes(readers, self.renames)
        self._image_windows_to_squeeze = _image_windows_to_squeeze(readers, windows, self.renames)
        self._said_no_subtask = False  # (said at the first batch, not every batch)
        sampled = [
            _sampled_frames(reader, {**options, **own}) for reader, own in zip(readers, own_options, strict=True)
        ]
        _check_frames_sampled(readers, sampled)
        if weights is None:
            weights = sampled
        elif len(weights) != len(readers) or not all(is_number(w) for w in weights):
            raise ValueError(f"weights must hold one number per dataset ({len(readers)}), got {weights!r}")
        if batch_size < len(readers):
            raise ValueError(f"batch_size={batch_size} cannot give each of {len(readers)} datasets a sample per batch")
        self.batch_shares = batch_shares(weights, batch_size)
        self.batch_size = batch_size
        workers = (
            (0,) * len(readers) if num_workers == 0 else batch_shares(self.batch_shares, max(num_workers, len(readers)))
        )
        threads = options.pop("dali_threads", None)
        if threads is None:
            threads_total = max(default_dali_threads(num_workers), len(readers))
            dali_threads = batch_shares(self.batch_shares, threads_total)
        else:
            dali_threads = (check_int("dali_threads", threads, minimum=1),) * len(readers)
        built: dict[int, DALILeRobotIterator] = {}
        # This thread's CUDA device, which plain "cuda" means where no LOCAL_RANK says (:func:`.rank_cuda_device`): each
        # dataset is built in a thread of its own, whose device is 0 (an mp.spawn rank on cuda:1 built them on cuda:0).
        cuda_device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

        def build(i: int) -> DALILeRobotIterator:
            if cuda_device is not None:
                torch.cuda.set_device(cuda_device)
            built[i] = DALILeRobotIterator(
                readers[i],
                batch_size=self.batch_shares[i],
                seed=_dataset_seed(seed, i),
                num_workers=workers[i],
                dali_threads=dali_threads[i],
                drop_last=True,
                **_own_names({**options, **own_options[i]}, self.renames[i]),
            )
            return built[i]

        try:  # (at once: each checks its first files, over a network one request after another)
            self.datasets = in_threads(build, range(len(readers)), progress="lerobot-dali: preparing datasets")
        except BaseException:
            _close_each(built.values())  # (every build has ended: in_threads waits for all)
            raise
        for part, share in zip(self.datasets, self.batch_shares, strict=True):  # (one budget of /dev/shm for all)
            part._shm_fraction = share / batch_size
        # The anchor: the dataset read once in the most batches (its epoch is the mixture's).
        self.anchor = int(np.argmax([n / share for n, share in zip(sampled, self.batch_shares, strict=True)]))
        self.rank, self.world_size = self.datasets[0].rank, self.datasets[0].world_size
        self._check_parts_fill_batches()
        self._schedules = {i: self._schedule(i) for i in range(len(readers)) if i != self.anchor}
        self._pass_id = 0
        #: The datasets' states before the batch being read, and the loads they were taken under (``_loads``).
        self._reading: tuple[int, list[dict[str, Any]]] | None = None
        #: The states a load from another thread halfway through started from (the datasets stand part here, part
        #: there); and how many batches and loads began, so a state_dict() that read the datasets as one began reads
        #: them again.
        self._load_start: list[dict[str, Any]] | None = None
        self._changes = 0
        self._dataset_index = torch.repeat_interleave(torch.arange(len(readers)), torch.tensor(self.batch_shares))
        say_once(logger, logging.INFO,
            "mixture of %d datasets, per batch of %d: %s; its epoch is one of %s (%d batches); worker processes %s",
            len(readers), batch_size,
            ", ".join(f"{n} of {r.location.description}" for n, r in zip(self.batch_shares, readers, strict=True)),
            readers[self.anchor].location.description, len(self), list(workers),
        )  # fmt: skip
        _warn_of_raised_shares(weights, self.batch_shares, [r.location.description for r in readers])
        for reader, rename in zip(readers, self.renames, strict=True):
            if rename:
                say_once(logger, logging.INFO, "mixture: %s keys renamed %s", reader.location.description,
                         dict(rename.to_batch))  # fmt: skip

    def _check_parts_fill_batches(self) -> None:
        for i, part in enumerate(self.datasets):
            if i != self.anchor and len(part) == 0:  # it would never give its share
                self.close()
                raise ShardingError(
                    f"{part.reader.location.description} gives rank {self.rank} fewer samples an epoch than its "
                    f"share of a batch ({self.batch_shares[i]}): lower its weight or the batch size, or run fewer ranks"
                )

    def _schedule(self, i: int) -> PartSchedule:
        # (its functions hold the iterators, not the mixture: no cycle delays closing a dropped mixture's workers)
        anchor, part = self.datasets[self.anchor], self.datasets[i]
        share, part_share, rank = self.batch_shares[self.anchor], self.batch_shares[i], self.rank
        return PartSchedule(
            lambda e: anchor.epoch_samples(e) // share,
            part.epoch_samples,
            lambda k: _starved(part, k, rank, part_share),
            share=part_share,
        )

    # -- epochs and state --------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches a pass over the current epoch yields (the anchor's, counted as a ``DataLoader`` counts)."""
        return len(self.datasets[self.anchor])

    @property
    def epoch(self) -> int:
        """The mixture's epoch: that of its anchor dataset (:attr:`anchor`, the one whose epoch is the mixture's)."""
        return self.datasets[self.anchor].epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (no-op for the epoch in progress, so it never undoes a resume): the anchor at its start, the
        others where that epoch starts them (a state_dict() taken next resumes it as read here). From another thread,
        as a load: a batch being read meanwhile ends the pass with :class:`~.errors.IteratorClosedError` and restores
        nothing (it would undo the new epoch), and the next pass reads ``epoch`` from its start.

        All or nothing: where a dataset's move fails (refused, or interrupted: a Ctrl-C), every dataset is put back
        where it stood and the error, raised, says so (it left the anchor in the new epoch, the others in the old: the
        call failed, yet the mixture read the new epoch, and a state taken meanwhile held its datasets in both).
        """
        anchor = self.datasets[self.anchor]
        with self._moving() as before:
            started = anchor.epoch
            try:
                anchor.set_epoch(epoch)
                # The others where the new epoch starts them, now, as iter() would: left for iter(), a state_dict()
                # taken before it held them where they stood, and resumed there (a mixture set to epoch 2 four batches
                # into epoch 0, resumed: the other dataset read from its batch 4, not where epoch 2 starts it).
                if anchor.epoch != started:
                    for i, schedule in self._schedules.items():
                        _restart(self.datasets[i], *schedule.start(anchor.epoch), "the mixture's set_epoch()")
            except BaseException as e:
                if anchor.epoch != started:  # (else none moved: a refused epoch)
                    self._restore(before)
                    _say_undone(e, f"the mixture's set_epoch({epoch!r}) moved no dataset: each stands where it stood "
                                f"(epoch {started}); the error above is what stopped it")  # fmt: skip
                raise
            if anchor.epoch != started:
                self._loads += 1

    def state_dict(self) -> dict[str, Any]:
        """Each dataset's stream state, and the shares and anchor they were taken at. Taken while a batch is being
        read (a signal handler's checkpoint on the reading thread, or another thread's), the states before it: its
        parts are counted one after another, and a state with some counted resumed to repeat the others. Taken after a
        load from another thread (in that batch too, which the load ends), the loaded states: those before the batch
        were of the position the load replaced, and resumed it 3 batches before the loaded one (1 of 1). Taken as a
        load is halfway, the states it started from. It takes no lock: a signal handler's, on a thread inside a part's
        read, would wait for a load from another thread, which waits for that read."""
        while True:
            changes, start, reading = self._changes, self._load_start, self._reading
            if start is not None:
                states = start
            elif reading is not None and reading[0] == self._loads:
                states = reading[1]
            else:
                states = [part.state_dict() for part in self.datasets]
                if self._changes != changes:  # (a batch or load began as they were read: some may be of either)
                    continue
            break
        return {
            "mixture": {
                "batch_shares": list(self.batch_shares),
                "anchor": self.anchor,
                "seed": self._seed,
                "dataset_contents": dataset_contents([part.reader for part in self.datasets]),
                DATASET_IDENTITIES: dataset_identities([part.reader for part in self.datasets]),
            },
            "datasets": copy.deepcopy(states),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue where ``state_dict`` (a :meth:`state_dict`) left off, each dataset where it stood. A state of
        other datasets, another order of them or another anchor is refused (:class:`~.errors.ResumeStateError`);
        one saved at other shares (weights, batch size) warns and continues each dataset where it stood. Each dataset
        keeps the seed it was saved with, whatever ``seed=`` this mixture was built with: where they differ, a warning
        names both."""
        saved = state_dict.get("mixture") if isinstance(state_dict, Mapping) else None
        parts = state_dict.get("datasets") if isinstance(state_dict, Mapping) else None
        if not isinstance(saved, Mapping) or not isinstance(parts, Sequence):
            raise ResumeStateError(
                f"this is not the state of a mixture of {len(self.datasets)} datasets (DALILeRobotMixture.state_dict)"
            )
        refuse_another_order(saved, [part.reader for part in self.datasets], "the mixture")  # (names those added)
        if len(parts) != len(self.datasets):
            raise ResumeStateError(
                f"this state was saved over a mixture of {len(parts)} datasets, not of these {len(self.datasets)} "
                f"({', '.join(part.reader.location.description for part in self.datasets)}): resume with the datasets "
                "it was saved over, listed as they were then"
            )
        if saved.get("anchor") != self.anchor:
            raise ResumeStateError(
                f"this state was saved with dataset {saved.get('anchor')} as the anchor (the one whose epoch is the "
                f"mixture's), but these datasets and weights make it dataset {self.anchor}: resume with the same "
                f"weights (shares per batch then: {saved.get('batch_shares')})"
            )
        if list(saved.get("batch_shares", [])) != list(self.batch_shares):
            warn_once(logger,
                "resuming a mixture saved with batch shares %s at shares %s (other weights or batch size): each "
                "dataset continues at its own next sample, in other proportions",
                saved.get("batch_shares"), list(self.batch_shares),
            )  # fmt: skip
        with self._moving() as before:
            self._load_parts(parts, before)
        # (each kept its saved seed; told apart from those it was built with, not those of a state loaded before)
        built = [_dataset_seed(self._built_seed, i) for i in range(len(self.datasets))]
        if [part._stream.order.options.seed for part in self.datasets] != built:
            saved_seed = saved.get("seed")  # (states saved before it was recorded lack it)
            warn_of_another_seed(self._built_seed, saved_seed, "a mixture")
            self._seed = saved_seed
        else:
            self._seed = self._built_seed

    @contextlib.contextmanager
    def _moving(self) -> Iterator[list[dict[str, Any]]]:
        """Held to move the datasets from outside the reads (a load, set_epoch), giving their states before: a
        state_dict() meanwhile takes the states the move started from (those before a batch being read), not some
        moved and some not."""
        with self._loading:
            before = [part.state_dict() for part in self.datasets]
            reading = self._reading
            self._load_start = reading[1] if reading is not None and reading[0] == self._loads else before
            self._changes += 1
            try:
                yield before
            finally:
                self._load_start = None

    def _load_parts(self, parts: Sequence[Mapping[str, Any]], before: list[dict[str, Any]]) -> None:
        """load_state_dict() of each dataset's state in ``parts``, all or none (``before``: where they stood), with
        ``_loading`` held."""
        try:
            for part, state in zip(self.datasets, parts, strict=True):
                part._load(state, "load_state_dict()")  # (not its load_state_dict(): the mixture says of the seeds)
        except BaseException:  # all or none: a refused dataset's state leaves the others where they stood
            self._restore(before)
            raise
        self._loads += 1  # (loaded: a batch being read meanwhile, failed by it, restores nothing)
        # Starts computed before follow the orders replaced now (a resume on another world size changes the
        # resumed epoch's size): compute them again, as a process that loaded this state first does. Saved at
        # other shares, a dataset stands elsewhere than the schedule would put it: the later epochs start from
        # where it stands (it was moved back or on, repeating or skipping part of its epoch).
        self._schedules = {i: self._schedule(i) for i in self._schedules}
        anchor = self.datasets[self.anchor].state_dict()
        left = (self.datasets[self.anchor].epoch_samples(anchor["epoch"]) - anchor["samples_consumed"]) // (
            self.batch_shares[self.anchor]
        )
        at_start = anchor["samples_consumed"] == 0 and not anchor["prior_segments"]
        for i, schedule in self._schedules.items():
            stands = self.datasets[i].state_dict()
            schedule.rebase(anchor["epoch"], (stands["epoch"], stands["samples_consumed"]), left, at_start=at_start)

    # -- iteration ---------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """A pass over the rest of the mixture's epoch (its anchor's), each batch holding every dataset's share, in
        the datasets' order; like the iterator's, it carries on from the last batch handed out."""
        closes = self._closes  # (a close() from here on ends this pass)
        # The anchor at the start of its epoch (a new mixture epoch, however reached, set_epoch back included): the
        # others go where this mixture epoch starts them, which is where they stand after the epoch before (then
        # nothing restarts). Else each continues from where it stands (a pass left early, a resume, one after
        # another world size, whose anchor carries prior segments). Not as a load from another thread moves them: one
        # after the anchor was read here was undone, the others put back at that epoch's start (1 of 1 such points).
        with self._loading:
            anchor = self.datasets[self.anchor].state_dict()
            if anchor["samples_consumed"] == 0 and not anchor["prior_segments"]:
                for i, schedule in self._schedules.items():
                    _restart(self.datasets[i], *schedule.start(anchor["epoch"]), "the mixture's iter()")
        self._pass_id += 1
        return self._batches(self._pass_id, closes, self._start(self.datasets, closes))

    def _start(self, parts: list[DALILeRobotIterator], closes: int) -> list[Iterator[dict[str, Any]]]:
        """The passes of ``parts``. Pipelines that must start (the first pass, a jump) start side by side: each waits
        about a second for its worker processes to start, which one after another would add up per dataset; a
        long build is said once for all. A close() since the mixture's pass began (``closes``: the count then)
        closes them once all are built, so they raise IteratorClosedError: one started after it ran on."""
        try:
            try:
                with self._starting, builds_said_together(parts):
                    return in_threads(iter, parts)
            finally:
                self._close_if_closed_since(closes)
        except BaseException:  # (a second signal's exception, a Ctrl-C, landed in that close: run again)
            self._close_if_closed_since(closes)
            raise

    def _close_if_closed_since(self, closes: int) -> None:
        if self._closes != closes:
            self.close()

    def _batches(self, pass_id: int, closes: int, passes: list[Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
        while True:
            if pass_id != self._pass_id:
                raise IteratorClosedError(
                    "a newer pass (a second iter() of the mixture) replaced this one; iterate the newest"
                )
            with self._loading:  # (one load's states, and its count: not those of a load from another thread halfway)
                self._changes += 1
                loads = self._loads
                before = [part.state_dict() for part in self.datasets]
                self._reading = (loads, before)
            try:
                anchor = next(passes[self.anchor], None)
                if anchor is None:  # the mixture's epoch is over
                    return
                parts = [
                    anchor if i == self.anchor else self._next_part(i, passes, closes, loads)
                    for i in range(len(passes))
                ]
                batch = self._join(parts)
            except BaseException as e:
                with self._loading:  # (a load from another thread since: its positions stay, not those before it)
                    moved = self._loads != loads
                    if not moved:
                        self._restore(before)  # a part taken while another failed is not lost: the next pass reads it
                if moved and isinstance(e, IteratorClosedError):  # (named as the anchor's: a set_epoch moved the
                    raise self.datasets[self.anchor]._loaded_error() from e  # others by a load, as their errors say)
                raise
            finally:  # (no call between this and the yield, so no signal's handler runs there)
                self._reading = None
            yield batch

    def _next_part(self, i: int, passes: list[Iterator[dict[str, Any]]], closes: int, loads: int) -> dict[str, Any]:
        """The next part of dataset ``i`` (not the anchor), starting its next epoch where one is over. ``loads``: the
        mixture's as the batch began; a load since ends it (IteratorClosedError) before the new epoch's pass reads."""
        for _ in range(3):  # (an epoch taken to its end before this pass gives an empty pass first)
            part = next(passes[i], None)
            if part is not None:
                return part
            # A load from another thread before this pass starts (it counts its reads from where the load put the
            # dataset, so none ends it) went unseen: the batch joined the anchor's part, read at the old position, to
            # this dataset's at the loaded one, and was handed out (the dataset's loaded batch lost; 4 of 277 fuzzed
            # load points). Started under the lock a load holds: a load came before (said here), or comes after the
            # start (the new pass's read, or the anchor's next, ends the batch).
            with self._loading:
                passes[i] = self._start([self.datasets[i]], closes)[0]
                if self._loads != loads:
                    raise self.datasets[self.anchor]._loaded_error()
        raise _starved(self.datasets[i], self.datasets[i].epoch, self.rank, self.batch_shares[i])

    def _restore(self, states: list[dict[str, Any]]) -> None:
        for part, state in zip(self.datasets, states, strict=True):
            if part.state_dict() != state:
                part._load(state, "load_state_dict()")  # (not its load_state_dict(): a seed put back is no resume's)

    def _join(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        parts = [rename.batch(part) for rename, part in zip(self.renames, parts, strict=True)]
        for part, squeezed in zip(parts, self._image_windows_to_squeeze, strict=True):
            for camera in squeezed:
                part[camera] = part[camera].squeeze(1)
        with_subtask = ["subtask" in part for part in parts]
        if any(with_subtask) and not all(with_subtask):  # (meta/subtasks.parquet in some datasets only)
            if not self._said_no_subtask:
                lacking = [d.reader.location.description for d, has in zip(self.datasets, with_subtask, strict=True)
                           if not has]  # fmt: skip
                warn_once(logger, "a mixture's batches carry no 'subtask' strings: %s have no subtask list "
                          "(meta/subtasks.parquet) beside subtask_index", lacking)  # fmt: skip
                self._said_no_subtask = True
            parts = [{key: value for key, value in part.items() if key != "subtask"} for part in parts]
        keys = list(parts[0])
        for part in parts[1:]:
            if set(part) != set(keys):  # (ruled out at construction: the same selection and windows for all)
                raise SchemaMismatchError(f"the datasets' batches carry different keys: {keys} and {list(part)}")
        batch: dict[str, Any] = {}
        for key in keys:
            values = [part[key] for part in parts]
            if not isinstance(values[0], torch.Tensor):
                batch[key] = [item for value in values for item in value]
                continue
            if len({(v.dtype, v.shape[1:]) for v in values}) > 1:
                raise self._mismatch(key, values)
            batch[key] = torch.cat(values)
        device = parts[0]["index"].device
        batch[DATASET_INDEX] = self._dataset_index.to(device, copy=True)
        return batch

    def _mismatch(self, key: str, values: list[torch.Tensor]) -> SchemaMismatchError:
        found = "; ".join(
            f"{part.reader.location.description}: {v.dtype} {tuple(v.shape[1:])}"
            for part, v in zip(self.datasets, values, strict=True)
        )
        camera = key in self.renames[0].batch_names(self.datasets[0].reader.all_camera_keys)
        if camera and len({(v.dtype, v.shape[1:-2]) for v in values}) == 1:  # only the frame sizes differ
            hint = "pass image_size=(H, W) to resize every dataset's frames to one size"
        elif camera:
            hint = "their frames differ in more than size (channels, depth or colour); leave it out with cameras=[...]"
        else:
            hint = "leave it out with keys=[...] or make the datasets agree"
        return SchemaMismatchError(f"{key!r} differs across the mixture's datasets ({found}): {hint}")

    @property
    def camera_channels(self) -> dict[str, int]:
        """Colour channels of each camera's frames, in batch order (as :attr:`DALILeRobotIterator.camera_channels`)."""
        return {self.renames[0].batch_name(k): n for k, n in self.datasets[0].camera_channels.items()}

    def __enter__(self) -> DALILeRobotMixture:
        """``with DALILeRobotMixture(...) as it:`` closes it (:meth:`close`) as the block ends, by an error too."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every dataset's worker processes now; the pass in progress raises IteratorClosedError.

        A pass starting its datasets' pipelines meanwhile closes them once all are built: closed one by one here, a
        dataset whose build had not begun was built after it, and its pipeline and workers ran on. On the thread
        starting them (a signal handler's close()) this leaves it to that pass; from another, it waits for them, up to
        ``CLOSE_WAIT_S`` as :meth:`DALILeRobotIterator.close` does (it waited for ever: a build held 10 s held it 10 s),
        then leaves them to that pass with a warning. That wait and those for passes inside the datasets' DALI next()
        are ``CLOSE_WAIT_S`` in all."""
        self._closes += 1
        if fork_locks.held_here(self._starting):
            return
        try:  # (taken inside the try whose finally lets it go, as DALILeRobotIterator.close() takes its pass's lock)
            left = "they are left to it: that pass closes them once all are built"
            deadline = close_deadline()  # (one wait in all: for the pass starting them, then each dataset's pass)
            if wait_for_pass(self._starting, deadline, "starting the mixture's datasets' pipelines", left):
                _close_each(getattr(self, "datasets", ()), deadline)
        finally:
            try:  # noqa: SIM105  (suppress() is a Python call before the release: an exception there kept it)
                self._starting.release()
            except RuntimeError:  # not taken: the pass holds it, or a signal's exception landed before it was taken
                pass


def _close_each(parts: Iterable[DALILeRobotIterator], deadline: float | None = None) -> None:
    """Close every one of ``parts``, in order, also those after one whose close failed (a source's close, DALI's
    shutdown, a Ctrl-C): one after another, a failure left the others' pipelines and workers running. Then that failure
    is raised (the last one's, the earlier ones its context). ``deadline``: each waits for another thread's pass until
    then at most (:func:`~lerobot_dali.iterator.close_deadline`), not ``CLOSE_WAIT_S`` each."""
    with contextlib.ExitStack() as closes:
        for part in reversed(list(parts)):  # (an ExitStack runs them last-added first)
            if deadline is None:
                closes.callback(part.close)
            else:
                closes.callback(part._close_by, deadline)


def _sampled_frames(reader: LeRobotDatasetReader, options: Mapping[str, Any]) -> int:
    """Frames an epoch of ``reader`` samples: all, but those ``drop_n_first_frames``/``drop_n_last_frames`` leave
    out of every episode."""
    first = check_int("drop_n_first_frames", options.get("drop_n_first_frames", 0), minimum=0)
    last = check_int("drop_n_last_frames", options.get("drop_n_last_frames", 0), minimum=0)
    return int(EpisodePieces.cut(reader.episodes.length, None, drop_first=first, drop_last=last).length.sum())


def _check_frames_sampled(readers: Sequence[LeRobotDatasetReader], sampled: Sequence[int]) -> None:
    """A dataset whose ``drop_n_first_frames``/``drop_n_last_frames`` leave no frame to sample could never give its
    share: refused naming it (the default weights, its frames sampled, would be 0: not a weight the caller gave)."""
    empty = [reader.location.description for reader, n in zip(readers, sampled, strict=True) if n == 0]
    if empty:
        raise ShardingError(
            f"{empty}: drop_n_first_frames and drop_n_last_frames leave no frame of any episode to sample (every "
            "episode is no longer than both); lower them for these datasets (dataset_options=[...]) or leave the "
            "datasets out"
        )


def _starved(part: DALILeRobotIterator, epoch: int, rank: int, share: int) -> DatasetError:
    return DatasetError(
        f"{part.reader.location.description} gave no batch in two epochs in a row (epoch {epoch}): it has fewer "
        f"samples for rank {rank} than its share of a batch ({share}); lower its weight or the batch size, or run "
        "fewer ranks"
    )


def _say_undone(error: BaseException, note: str) -> None:
    """``note`` on ``error`` (from Python 3.11; before, logged as a warning)."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        logger.warning("%s", note)


def _restart(part: DALILeRobotIterator, epoch: int, sample: int, moved_by: str) -> None:
    """``part`` at ``sample`` of ``epoch``, afresh (its ``set_epoch`` keeps the position in the epoch in progress).
    One already there stays, with what it read of that epoch on other ranks (a resume's). ``moved_by``: the mixture's
    call, which a pass of ``part`` this ends names (a load of its own said 'load_state_dict()', never called)."""
    state = part.state_dict()
    if (state["epoch"], state["samples_consumed"]) != (epoch, sample):
        state.pop("walk", None)  # (the pool walk at the old position: the new one's is walked to)
        part._load({**state, "epoch": epoch, "samples_consumed": sample, "prior_segments": []}, moved_by)


def _check_options(options: Mapping[str, Any]) -> None:
    allowed = set(inspect.signature(DALILeRobotIterator.__init__).parameters) - _OWN_ARGUMENTS - {"self"}
    opening = sorted(set(options) & _OPENING_ARGUMENTS)
    if opening:
        raise TypeError(
            f"{', '.join(f'{n}=' for n in opening)} open a dataset, and may differ per dataset: pass each dataset "
            "opened, open_dataset(path, ...), in datasets"
        )
    if "drop_last" in options:
        raise TypeError("drop_last: every mixture batch is full (each dataset gives its share), so it takes none")
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"DALILeRobotMixture got unexpected argument(s) {unknown}")


def _per_dataset(dataset_options: Sequence[Mapping[str, Any] | None] | None, count: int) -> list[dict[str, Any]]:
    """``dataset_options`` checked: one mapping (or None) per dataset, of :data:`PER_DATASET_OPTIONS` (and
    :data:`RENAME_MAP`) only."""
    if dataset_options is None:
        return [{} for _ in range(count)]
    if isinstance(dataset_options, Mapping) or len(dataset_options) != count:
        raise TypeError(f"dataset_options takes one mapping (or None) per dataset ({count}), got {dataset_options!r}")
    checked = []
    for i, given in enumerate(dataset_options):
        given = dict(given or {})
        other = sorted(set(given) - PER_DATASET_OPTIONS - {RENAME_MAP})
        unknown = sorted(set(other) - set(inspect.signature(DALILeRobotIterator.__init__).parameters))
        if unknown:  # (a misspelt option, not one of every dataset)
            raise TypeError(
                f"dataset_options[{i}] sets {unknown}, which DALILeRobotIterator does not take; per dataset: "
                f"{sorted({*PER_DATASET_OPTIONS, RENAME_MAP})}"
            )
        if other:
            raise TypeError(
                f"dataset_options[{i}] sets {other}, which apply to every dataset alike (or, for those that open a "
                f"dataset, pass it opened with open_dataset); per dataset: {sorted({*PER_DATASET_OPTIONS, RENAME_MAP})}"
            )
        checked.append(given)
    return checked


def _own_names(options: dict[str, Any], rename: KeyRename) -> dict[str, Any]:
    """A dataset's iterator arguments with the keys they name (windows, per-camera normalisation) as its own."""
    if not rename:
        return options
    return {
        **options,
        "delta_timestamps": rename.own_windows(options.get("delta_timestamps")),
        "augment": rename.own_augment(options.get("augment")),
    }


def _dataset_seed(seed: int, position: int) -> int:
    """Each dataset's own seed (shuffle and augmentation draws), so datasets at the same position in their streams
    do not get the same draws."""
    return int(np.random.SeedSequence([seed, position]).generate_state(1)[0])


def _check_windows(
    readers: list[LeRobotDatasetReader],
    delta_timestamps: Mapping[str, Any] | None,
    renames: Sequence[KeyRename],
    *,
    cameras: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
) -> None:
    """Windows must name what every dataset's batches carry (a key one dataset lacks is left out of all); ``cameras``
    and ``keys``: the mixture's, which a refusal says to add a window's key to where they leave it out."""
    read = set(renames[0].batch_names(readers[0].read_keys))
    unread = sorted(set(delta_timestamps or {}) - read - set(INDEX_COLUMNS))
    if unread:
        named = list(zip(readers, renames, strict=True))
        camera_names = {c for r, n in named for c in n.batch_names(r.info.camera_keys)}
        feature_names = {k for r, n in named for k in n.batch_names(r.info.features)} - camera_names
        kinds = (("cameras", cameras, camera_names), ("keys", keys, feature_names))
        left_out = [  # (a rename alone cannot bring in a key cameras=/keys= leave out: it must be added there too)
            f"{what}= leaves out {left}: add them, {what}={[*given, *left]!r}"
            for what, given, names in kinds
            if given is not None and (left := [k for k in unread if k in names and k not in given])
        ]
        lacking = {
            reader.location.description: [k for k in unread if rename.own_name(k) not in reader.info.features]
            for reader, rename in named
        }
        short = next(((r, n) for r, n in named if lacking[r.location.description]), None)
        if short is None:  # (every dataset has them: cameras=/keys= leave them out)
            raise DeltaTimestampsError(
                f"delta_timestamps names {unread}, which the mixture does not read: "
                f"{'; '.join(left_out) or 'cameras=/keys= leave them out; add them there'}, or drop them from "
                "delta_timestamps"
            )
        reader, rename = short
        spare = [  # (not a key a window names: renamed, another dataset lacking it would lack it still)
            k
            for k in rename.batch_names(reader.info.features)
            if k not in read and k not in INDEX_COLUMNS and k not in (delta_timestamps or {})
        ]
        missing = lacking[reader.location.description]
        raise DeltaTimestampsError(
            f"delta_timestamps names {unread}, which the mixture does not read: not every dataset has them "
            f"({ {d: k for d, k in lacking.items() if k} })"
            f"{''.join(f', and {said}' for said in left_out) or ', or cameras=/keys= leave them out'}"
            f"{rename_hint(missing, spare, rename, cameras=camera_names)}, or drop them from delta_timestamps"
        )


def _image_windows_to_squeeze(
    readers: list[LeRobotDatasetReader], delta_timestamps: Mapping[str, Any] | None, renames: Sequence[KeyRename]
) -> list[frozenset[str]]:
    """Per dataset, the image cameras whose one-step window batches as the video cameras' of another dataset.

    LeRobot squeezes decoded video, not image rows: a one-step window gives a video camera (B, C, H, W) and an
    image camera (B, 1, C, H, W). Where the datasets store one camera both ways, the video shape is the batch's.
    """
    one_step = {key for key, deltas in (delta_timestamps or {}).items() if len(deltas) == 1}
    video = [set(rename.batch_names(r.camera_keys)) for r, rename in zip(readers, renames, strict=True)]
    image = [set(rename.batch_names(r.image_keys)) for r, rename in zip(readers, renames, strict=True)]
    both = one_step & set().union(*video) & set().union(*image)
    return [frozenset(both & keys) for keys in image]


def _check_shapes(readers: list[LeRobotDatasetReader], renames: Sequence[KeyRename]) -> None:
    """Tabular features that batch together must be declared with one shape (cameras are checked on the first
    batch, after resizing)."""
    refuse_dataset_index_feature(readers, renames, "mixture batches")
    for key in renames[0].batch_names(readers[0].tabular_keys):
        features = [reader.info.features[rename.own_key(key)] for reader, rename in zip(readers, renames, strict=True)]
        shapes = {
            r.location.description: () if f.is_scalar else f.shape for r, f in zip(readers, features, strict=True)
        }
        if len(set(shapes.values())) > 1:
            raise SchemaMismatchError(
                f"{key!r} has different shapes in the mixture's datasets ({shapes}): leave it out with keys=[...]"
            )
