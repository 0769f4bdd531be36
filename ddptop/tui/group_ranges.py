"""The step and seq ranges of a view's group rows, kept from the ranks that moved.

A group row shows its members' lowest and highest step and seq. Summed when painted, a group
of 32,768 ranks cost two passes over its members (about 7 ms; three groups on a screen, at
each of four redraws a second). Here each group of the kind the table shows keeps a count of
its members' values instead (``{step: ranks at it}``: a few keys, since ranks of one job move
together), moved by the row index as each rank folds (a few dict operations), so a range is
the extremes of a few keys. Exact: a group with values all apart costs what the pass did.

Only the kind on screen is kept (``odd`` shows the ``rest`` groups; ``node``, ``status`` and
``collective`` their own): switching views counts the new kind once.
"""

from __future__ import annotations

from collections.abc import Iterable

GroupKey = tuple[str, ...]
Range = tuple[int | None, int | None]


def _shift(counts: dict[int, int], before: int | None, after: int | None) -> None:
    # One rank's value moved within a group; None is "no value" (never counted). Plain dicts
    # and dict.get: a Counter's missing key costs a Python call, at 32,768 folds a second.
    if before == after:
        return
    if before is not None:
        left = counts[before] - 1
        if left:
            counts[before] = left
        else:
            del counts[before]
    if after is not None:
        counts[after] = counts.get(after, 0) + 1


def _extremes(counts: dict[int, int]) -> Range:
    return (min(counts), max(counts)) if counts else (None, None)


class GroupRanges:
    """Counts of the step and seq values of each group of one kind (see module doc)."""

    def __init__(self, kind: str, slot: int) -> None:
        self.kind = kind
        self.slot = slot  # where the kind's key sits in a rank's keys tuple
        self._steps: dict[GroupKey, dict[int, int]] = {}
        self._seqs: dict[GroupKey, dict[int, int]] = {}

    def count_all(self, keys: dict[int, tuple[GroupKey, ...]], steps: dict[int, int],
                  seqs: dict[int, int]) -> None:
        """Count every rank from scratch (the kind was just put on screen)."""
        self._steps, self._seqs = {}, {}
        slot = self.slot
        for rank, ranks_keys in keys.items():
            self.add(ranks_keys[slot], steps.get(rank), seqs.get(rank))

    def add(self, key: GroupKey, step: int | None, seq: int | None) -> None:
        """A rank joined group *key* with these values."""
        if step is not None:
            _shift(self._steps.setdefault(key, {}), None, step)
        if seq is not None:
            _shift(self._seqs.setdefault(key, {}), None, seq)

    def remove(self, key: GroupKey, step: int | None, seq: int | None) -> None:
        """A rank left group *key*, where it had these values."""
        for counts, value in ((self._steps, step), (self._seqs, seq)):
            if value is not None:
                within = counts[key]
                _shift(within, value, None)
                if not within:
                    del counts[key]

    def moved(self, key: GroupKey, step_before: int | None, step: int | None,
              seq_before: int | None, seq: int | None) -> None:
        """A rank of group *key* moved its values (the usual change: a new sample)."""
        if step_before != step:
            if step_before is None or step is None:
                self.remove(key, step_before, None)
                self.add(key, step, None)
            else:  # inline, here and for seq: every rank that folds comes here, and through
                # _shift (with its checks) a move cost 1.02 us against 0.51 us
                counts = self._steps[key]
                left = counts[step_before] - 1
                if left:
                    counts[step_before] = left
                else:
                    del counts[step_before]
                counts[step] = counts.get(step, 0) + 1
        if seq_before != seq:
            if seq_before is None or seq is None:
                self.remove(key, None, seq_before)
                self.add(key, None, seq)
            else:
                counts = self._seqs[key]
                left = counts[seq_before] - 1
                if left:
                    counts[seq_before] = left
                else:
                    del counts[seq_before]
                counts[seq] = counts.get(seq, 0) + 1

    def ranges(self, key: GroupKey,
               without: Iterable[tuple[int | None, int | None]] = ()) -> tuple[Range, Range]:
        """Group *key*'s (step lo, hi) and (seq lo, hi), its members' values *without* some
        (the odd ranks the odd view lists apart) taken out first."""
        steps, seqs = self._steps.get(key, {}), self._seqs.get(key, {})
        taken = list(without)
        if taken:
            steps, seqs = dict(steps), dict(seqs)
            for step, seq in taken:
                _shift(steps, step, None)
                _shift(seqs, seq, None)
        return _extremes(steps), _extremes(seqs)
