"""``split_shared_advice``: the trailing sentences several messages share, said once; every fact kept."""

from __future__ import annotations

from lerobot_dali.shared_advice import ELIDED, episode_spans, split_shared_advice

ADVICE = (
    "Look frames up by frame_index / fps (timestamp_source='frame_index'; on the command line --timestamp-source "
    "frame_index)."
)


def _fact(episode: int, end_s: float) -> str:
    return (
        f"episode {episode}: query timestamp {end_s + 0.5:.6f} s has no frame (the video spans 0.000000-{end_s:.6f} s)."
    )


def test_advice_several_messages_end_with_is_said_once_and_a_lone_one_stays_whole() -> None:
    lone = "episode 5: query 0.030668 s has no frame. If its timestamps are wall-clock time, read by frame_index."
    messages = [f"{_fact(0, 19.6)} {ADVICE}", lone, f"{_fact(1, 21.4)} {ADVICE}"]
    split = split_shared_advice(messages)
    assert split.own == [_fact(0, 19.6), lone, _fact(1, 21.4)]
    assert split.advice == [ADVICE] and split.advice_of == [0, None, 0] and split.sharing(0) == [0, 2]
    longer = f"Or leave the episode out with episodes=, where it is one of few. {ADVICE}"
    messages = [f"{_fact(0, 19.6)} {ADVICE}", f"{_fact(1, 2.0)} {longer}", f"{_fact(2, 3.0)} {longer}", messages[2]]
    split = split_shared_advice(messages)  # (the longer taken first; each named by the first message sharing it)
    assert split.advice == [ADVICE, longer] and split.advice_of == [0, 1, 1, 0]


def test_a_number_that_differs_is_elided_only_where_each_message_says_it_itself() -> None:
    """The advice's sentence naming where each episode's last row belongs (its video's end, said in its facts) is
    shared with the number elided; one whose number its facts do not say stays its own, the sentence after shared."""
    belongs = (
        "The row lies past where the episode's last row belongs ({:.6f} s: length - 1 rows at fps after its start)."
    )
    messages = [f"{_fact(e, end)} {belongs.format(end)} {ADVICE}" for e, end in ((0, 19.6), (1, 21.4))]
    split = split_shared_advice(messages)
    assert split.own == [_fact(0, 19.6), _fact(1, 21.4)]
    assert split.advice == [f"{belongs.format(0).replace('0.000000', ELIDED)} {ADVICE}"]
    messages[1] = f"{_fact(1, 21.4)} {belongs.format(30.0)} {ADVICE}"  # (30 s said nowhere else in it)
    split = split_shared_advice(messages)
    assert split.own == [f"{_fact(0, 19.6)} {belongs.format(19.6)}", f"{_fact(1, 21.4)} {belongs.format(30.0)}"]
    assert split.advice == [ADVICE]
    same = [f"{_fact(e, 19.6)} {belongs.format(19.6)} {ADVICE}" for e in (0, 1)]  # (a number alike: said as is)
    assert split_shared_advice(same).advice == [f"{belongs.format(19.6)} {ADVICE}"]


def test_a_first_sentence_is_never_advice_nor_a_short_one_or_a_stop_inside_brackets() -> None:
    alike = [f"{_fact(0, 19.6)} {ADVICE}"] * 2  # (the same problem twice: its facts are still each's)
    assert split_shared_advice(alike).own == [_fact(0, 19.6)] * 2
    short = [f"{_fact(e, 19.6)} Re-encode it." for e in (0, 1)]
    assert split_shared_advice(short).own == short and split_shared_advice(short).advice == []
    assert split_shared_advice(short, min_chars=5).advice == ["Re-encode it."]
    bracketed = [f"episode {e}: no frame (e.g. late. Or early. {ADVICE})" for e in (0, 1)]
    assert split_shared_advice(bracketed).own == bracketed
    assert split_shared_advice([]).own == [] and split_shared_advice([ADVICE]).own == [ADVICE]


def test_episode_spans() -> None:
    assert episode_spans([0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]) == "0-4, 6-11"
    assert (episode_spans([3]), episode_spans([5, 3, 3])) == ("3", "3, 5")
