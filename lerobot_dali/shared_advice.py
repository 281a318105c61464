"""The advice several problems' messages end with, said once (``lerobot-dali check``'s listing).

An error's message is its facts, then what to do: a training run raises one alone, so each says it all. A check lists
every episode's, and a fault most episodes share (cr5_v21_av1's wall-clock timestamps: 12 problems) repeated the same
advice of ~300 characters in each, 11 alike. :func:`split_shared_advice` finds, among the messages listed, the
trailing sentences several of them share, so each problem's own facts are printed and that advice once, for them all.
No message is worded for it: a run of whole sentences at a message's end, the same in several messages but for
numbers, is shared advice. A number that differs among them (where an episode's last row belongs, say) is left out of
the advice said once only where each message's own part says it too, so nothing printed is lost; else the sentence
stays each message's own. ``--json`` keeps every message whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ELIDED", "MIN_ADVICE_CHARS", "SplitMessages", "episode_spans", "split_shared_advice"]

#: Shared advice shorter than this stays in each message: a reference to it saves no reading.
MIN_ADVICE_CHARS = 80
#: Where shared advice leaves out a number that differs among its messages (each says its own).
ELIDED = "…"

#: A number as messages write them (``19.600000``, ``0.0001``, ``196``), not a digit inside a word (``mp4``, ``x264``).
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")
_OPENING, _CLOSING = "([{", ")]}"


@dataclass(frozen=True)
class SplitMessages:
    """Messages parted into each one's own text and the advice shared (:func:`split_shared_advice`)."""

    #: Each message's own part: its text before the advice it shares, or the whole message where it shares none.
    own: list[str]
    #: The position in ``advice`` of the advice each message shares, None where it shares none.
    advice_of: list[int | None]
    #: Each advice shared, in the order of the first message sharing it.
    advice: list[str]

    def sharing(self, advice: int) -> list[int]:
        """The positions of the messages that share advice ``advice``."""
        return [i for i, shared in enumerate(self.advice_of) if shared == advice]


def split_shared_advice(messages: Sequence[str], *, min_chars: int = MIN_ADVICE_CHARS) -> SplitMessages:
    """``messages`` parted into their own text and the trailing sentences two or more share (at least ``min_chars``
    long; never a message's first sentence, its facts). The longest advice shared is taken first; a message shares
    one advice at most."""
    tails = [_tails(message) for message in messages]
    candidates: dict[str, list[tuple[int, int]]] = {}  # template -> (message, where its tail starts)
    for i, starts in enumerate(tails):
        for start in starts:
            candidates.setdefault(_template(messages[i][start:]), []).append((i, start))
    own, advice = list(messages), list[str]()
    advice_of: list[int | None] = [None] * len(messages)
    taken: dict[int, tuple[int, int]] = {}  # message -> (advice, where it starts)
    for template in sorted(candidates, key=len, reverse=True):
        members = [(i, start) for i, start in candidates[template] if i not in taken]
        said = _said_once(messages, members) if len(members) > 1 and len(template) >= min_chars else None
        if said is None:
            continue
        for i, start in members:
            taken[i] = (len(advice), start)
        advice.append(said)
    first_of = {shared: i for i, (shared, _) in sorted(taken.items(), reverse=True)}  # (each advice's first message)
    order = sorted(first_of, key=first_of.__getitem__)
    renumbered = {shared: at for at, shared in enumerate(order)}
    for i, (shared, start) in taken.items():
        own[i], advice_of[i] = messages[i][:start].rstrip(), renumbered[shared]
    return SplitMessages(own, advice_of, [advice[shared] for shared in order])


def _said_once(messages: Sequence[str], members: list[tuple[int, int]]) -> str | None:
    """The advice ``members`` (message, where its tail starts) share, as said once: their tails alike but for
    numbers, each number that differs among them elided; None where one of them differs in a number its own part
    does not say."""
    numbers = [[m.group() for m in _NUMBER.finditer(messages[i][start:])] for i, start in members]
    first, start = members[0]
    tail = messages[first][start:]
    elided = []
    for k, values in enumerate(zip(*numbers, strict=True)):
        if len(set(values)) == 1:
            continue
        for (i, at), value in zip(members, values, strict=True):
            if value not in _NUMBER.findall(messages[i][:at]):
                return None
        elided.append(k)
    pieces, end = [], 0
    for k, m in enumerate(_NUMBER.finditer(tail)):
        if k in elided:
            pieces += [tail[end : m.start()], ELIDED]
            end = m.end()
    return "".join([*pieces, tail[end:]])


def _template(text: str) -> str:
    return _NUMBER.sub("#", text)


def _tails(message: str) -> list[int]:
    """Where each sentence of ``message`` but its first starts: a capital after a full stop (or ! or ?) and a space,
    outside brackets (``e.g. a frame late`` and ``(... 19.600000 s. ...)`` go on)."""
    starts, depth = [], 0
    for at, char in enumerate(message):
        if char in _OPENING:
            depth += 1
        elif char in _CLOSING:
            depth = max(0, depth - 1)
        elif depth == 0 and char in ".!?" and message[at + 1 : at + 2] == " " and message[at + 2 : at + 3].isupper():
            starts.append(at + 2)
    return starts


def episode_spans(episodes: Sequence[int]) -> str:
    """Episode indices as runs: ``0-4, 6-11``; ``3``; ``3, 5``."""
    ordered = sorted(set(episodes))
    runs: list[list[int]] = []
    for episode in ordered:
        if runs and episode == runs[-1][-1] + 1:
            runs[-1].append(episode)
        else:
            runs.append([episode])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)
