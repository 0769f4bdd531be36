"""The one-story property (#33 item 5), asserted on every diagnosis the test suite makes.

No two findings that explain an event (a hang, a failure: ``story.EVENT_KINDS``; conditions
such as a straggler or an input-bound rank are not events) of warning or worse that name their
cause with certainty, of different kinds, may blame different ranks (one is the lead; what
followed from it is its spread, and a finding that blames a subset of the lead's culprits
agrees with it). ``tests/conftest.py`` wraps the
engine's story pass with :func:`checked` for every test, so every scenario the suite diagnoses in
its own process — unit snapshots, recordings, real dumps and logs, the dashboard's live
diagnosis — is held to it, not only the ones a test names.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import msgspec

from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.story import EVENT_KINDS, blames, culprits

Found = list[tuple[int, Finding]]


def assert_one_story(findings: list[Finding]) -> None:
    """Raise AssertionError where two certain, warning-or-worse findings of different kinds
    blame different ranks (neither's culprits within the other's), or where one blames a rank
    another calls a victim."""
    told = [f for f in findings if blames(f) and f.kind in EVENT_KINDS]
    # No victim in a certain finding (#45): a rank that a warning-or-worse finding of an event says
    # waited for or failed because of another is never another's certain cause.
    victims = {r for f in findings if f.kind in EVENT_KINDS and f.at_least("warning") for r in f.victims}
    for f in told:
        assert not culprits(f) & victims, (
            f"a victim named as a cause: {f.title!r} blames {sorted(culprits(f) & victims)}, called victims "
            "elsewhere")
    for a in told:
        for b in told:
            if a.kind != b.kind:
                ca, cb = culprits(a), culprits(b)
                assert ca <= cb or cb <= ca, f"two stories: {a.title!r} and {b.title!r}"


def assert_one_story_json(text: str) -> None:
    """:func:`assert_one_story` over `ddptop doctor --json` output (nothing where it is none)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return
    if isinstance(doc, dict) and isinstance(doc.get("findings"), list):
        assert_one_story([msgspec.convert(f, Finding) for f in doc["findings"]])


def checked(real: Callable[[Found], Found]) -> Callable[[Found], Found]:
    """*real* (the engine's ``one_story``), asserting the property on what it returns."""
    def story(found: Found) -> Found:
        out = real(found)
        assert_one_story([f for _, f in out])
        return out
    return story
