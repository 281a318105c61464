"""A resume must run the order it was saved under: other shuffle, pool size or balance would make the saved
position mean other samples (the rest of the epoch would repeat some and skip others)."""

from __future__ import annotations

import numpy as np
import pytest

from lerobot_dali.errors import ResumeStateError
from lerobot_dali.sample_order import OrderOptions, RankBalance
from lerobot_dali.stream_state import SampleStream

LENGTHS = np.array([13, 40, 7, 25, 31, 5, 19])
SAVED = OrderOptions(seed=3, shuffle=True, episode_pool_size=2, rank_balance=RankBalance.PAD)


def _stream(options: OrderOptions, world_size: int = 2) -> SampleStream:
    return SampleStream(LENGTHS, rank=0, world_size=world_size, batch_size=5, options=options)


def _saved_state(world_size: int = 2) -> dict:
    stream = _stream(SAVED, world_size)
    for _ in range(3):
        stream.next_batch()
    return stream.state_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shuffle": False}, "saved with shuffle=True, but this stream runs with shuffle=False"),
        ({"episode_pool_size": 10}, "saved with episode_pool_size=2, but this stream runs with episode_pool_size=10"),
        (
            {"rank_balance": RankBalance.DROP},
            "saved with rank_balance='pad', but this stream runs with rank_balance='drop'",
        ),
        (  # (named as the iterator's argument, episode_piece_frames, that a user passes)
            {"piece_frames": 4},
            "saved with episode_piece_frames=None, but this stream runs with episode_piece_frames=4",
        ),
        ({"drop_n_last_frames": 7}, "saved with drop_n_last_frames=0, but this stream runs with drop_n_last_frames=7"),
        (
            {"drop_n_first_frames": 1},
            "saved with drop_n_first_frames=0, but this stream runs with drop_n_first_frames=1",
        ),
    ],
)
def test_a_resume_under_other_order_options_is_refused(change: dict, message: str) -> None:
    state = _saved_state()
    assert state["order"] == {"shuffle": True, "episode_pool_size": 2, "rank_balance": "pad", "piece_frames": None,
                              "drop_n_first_frames": 0, "drop_n_last_frames": 0}  # fmt: skip
    other = OrderOptions(**{**SAVED.__dict__, **change})
    with pytest.raises(ResumeStateError, match=message):
        _stream(other).load_state_dict(state)


def test_a_resume_under_the_saved_options_continues_the_uninterrupted_stream() -> None:
    whole = _stream(SAVED)
    expected = [whole.next_batch() for _ in range(6)][3:]
    resumed = _stream(OrderOptions(seed=99, shuffle=True, episode_pool_size=2))  # the saved seed is adopted
    resumed.load_state_dict(_saved_state())
    for want in expected:
        got = resumed.next_batch()
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_options_that_do_not_change_the_order_are_not_held_to() -> None:
    """Unshuffled, a pool emits its episodes in order whatever its size; one rank needs no balance."""
    unshuffled = OrderOptions(seed=3, shuffle=False, episode_pool_size=2)
    stream = _stream(unshuffled)
    stream.next_batch()
    _stream(OrderOptions(seed=3, shuffle=False, episode_pool_size=16)).load_state_dict(stream.state_dict())
    alone = _saved_state(world_size=1)
    _stream(OrderOptions(**{**SAVED.__dict__, "rank_balance": RankBalance.DROP}), world_size=1).load_state_dict(alone)


def test_a_state_of_one_rank_after_a_change_holds_to_the_old_ranks_balance() -> None:
    """Saved on 1 rank after a resume of a state of 2, the epoch's first segment was balanced over 2 ranks: another
    balance would make it mean other samples."""
    resumed = _stream(SAVED, world_size=1)
    resumed.load_state_dict(_saved_state(world_size=2))
    state = resumed.state_dict()
    assert state["world_size"] == 1 and state["prior_segments"] == [[2, 15]]
    other = OrderOptions(**{**SAVED.__dict__, "rank_balance": RankBalance.DROP})
    with pytest.raises(
        ResumeStateError, match="saved with rank_balance='pad', but this stream runs with rank_balance="
    ):
        _stream(other, world_size=1).load_state_dict(state)


def test_version_1_states_load_where_the_old_deal_does_not_matter() -> None:
    """States saved before the order options were recorded (version 1) came with another split of episodes
    across ranks: on one rank, or at an epoch's start, they resume exactly; part-way on several ranks they
    would repeat some samples and skip others, so they are refused with the way to go on."""
    for world_size in (1, 2):
        legacy = {k: v for k, v in _saved_state(world_size).items() if k != "order"} | {"version": 1}
        stream = _stream(SAVED, world_size)
        if world_size == 1:
            stream.load_state_dict(legacy)
            assert stream.samples_consumed == 15
            continue
        with pytest.raises(ResumeStateError, match=r"earlier lerobot_dali.*'epoch': 1, 'samples_consumed': 0"):
            stream.load_state_dict(legacy)
        stream.load_state_dict({**legacy, "epoch": 1, "samples_consumed": 0})
        assert (stream.epoch, stream.samples_consumed) == (1, 0)
        with pytest.raises(ResumeStateError, match="earlier lerobot_dali"):  # (at a segment's start, after a change)
            stream.load_state_dict({**legacy, "samples_consumed": 0, "prior_segments": [[1, 15]]})


def test_a_state_saved_before_episode_pieces_resumes_as_whole_episodes() -> None:
    """States saved before ``piece_frames`` existed lack it; they dealt whole episodes, as None does. Those saved
    before ``drop_n_first_frames`` and ``drop_n_last_frames`` sampled every frame, as 0 does."""
    state = _saved_state()
    later = ("piece_frames", "drop_n_first_frames", "drop_n_last_frames")
    older = {**state, "order": {k: v for k, v in state["order"].items() if k not in later}}
    whole = _stream(SAVED)
    expected = [whole.next_batch() for _ in range(5)][3:]
    resumed = _stream(SAVED)
    resumed.load_state_dict(older)
    for want in expected:
        np.testing.assert_array_equal(resumed.next_batch()[1], want[1])
    pieces = OrderOptions(**{**SAVED.__dict__, "piece_frames": 4})
    with pytest.raises(ResumeStateError, match="episode_piece_frames=None, but .* episode_piece_frames=4"):
        _stream(pieces).load_state_dict(older)
    dropping = OrderOptions(**{**SAVED.__dict__, "drop_n_last_frames": 2})
    with pytest.raises(ResumeStateError, match="drop_n_last_frames=0, but this stream runs with drop_n_last_frames=2"):
        _stream(dropping).load_state_dict(older)


@pytest.mark.parametrize("field", ["world_size", "batch_size"])
def test_a_state_of_no_ranks_or_empty_batches_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(ResumeStateError, match=f"stream state field '{field}' must be an int >= 1, got 0"):
        _stream(SAVED).load_state_dict({**_saved_state(), field: 0})


def test_a_malformed_order_entry_is_refused() -> None:
    with pytest.raises(ResumeStateError, match="order must be a dict of"):
        _stream(SAVED).load_state_dict({**_saved_state(), "order": {"shuffle": True}})
    state = _saved_state()
    with pytest.raises(ResumeStateError, match="order must be a dict of"):  # (a field this version does not know)
        _stream(SAVED).load_state_dict({**state, "order": {**state["order"], "episode_pool": 2}})


@pytest.mark.parametrize(
    ("lengths", "differs"),
    [
        (LENGTHS[:-1], "this stream runs over 6 episodes of 121 frames"),  # (one episode fewer)
        (LENGTHS + np.eye(len(LENGTHS), dtype=int)[2] * 3, "this stream runs over 7 episodes of 143 frames"),
        (LENGTHS[::-1], "this stream runs over 7 episodes of 140 frames (sha256"),  # (same lengths, other order)
    ],
    ids=["fewer", "longer", "reordered"],
)
def test_a_resume_over_other_episodes_is_refused_naming_them(lengths: np.ndarray, differs: str) -> None:
    """A bare stream's state (no iterator adds its episodes) said nothing of the episodes it ran over: loaded by a
    stream over others it continued at the saved position of another order (83 of 100 scripted resumes over one
    episode fewer, one longer or reordered went on silently). It names them now, and such a resume is refused."""
    state = _saved_state(world_size=1)
    # (these words exactly: checkpoints saved before carry them, and a resume compares them as text)
    assert state["episode_lengths"] == "7 episodes of 140 frames (sha256 16888a8a1aaa9b96)"
    other = SampleStream(lengths, rank=0, world_size=1, batch_size=5, options=SAVED)
    with pytest.raises(ResumeStateError, match="resume over the same episodes") as refused:
        other.load_state_dict(state)
    assert f"saved over {state['episode_lengths']}, but {differs}" in str(refused.value)
    older = {key: value for key, value in state.items() if key != "episode_lengths"}  # (saved before it was named)
    other.load_state_dict(older)
    assert other.samples_consumed == 15
    same = _stream(SAVED, world_size=1)
    same.load_state_dict(state)
    assert same.state_dict() == state
