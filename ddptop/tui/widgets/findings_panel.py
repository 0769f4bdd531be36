"""The findings panel: what the diagnosis sees, each with its ranks and first evidence."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ddptop.diagnosis.finding import Finding
from ddptop.textfmt import rank_ranges

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_SYMBOL = {"critical": "✖", "warning": "⚠", "info": "i"}
EVIDENCE_LINES = 2


def findings_text(found: list[Finding]) -> Text:
    """One block per finding: symbol, SEVERITY word, title, ranks, evidence, remedy."""
    text = Text()
    if not found:
        text.append("✓ nothing wrong seen", style="green")
        return text
    for i, f in enumerate(found):
        if i:
            text.append("\n")
        style = _STYLE.get(f.severity, "")
        text.append(f"{_SYMBOL.get(f.severity, '•')} {f.severity.upper():9}", style=style)
        text.append(f" {f.title}", style="bold")
        if f.ranks:
            text.append(f"  [rank{'s' if len(f.ranks) > 1 else ''} {rank_ranges(f.ranks)}]", style="dim")
        for line in f.evidence[:EVIDENCE_LINES]:
            text.append(f"\n    {line}", style="dim")
        if len(f.evidence) > EVIDENCE_LINES:
            text.append(f"\n    … {len(f.evidence) - EVIDENCE_LINES} more", style="dim")
        if f.remedy:
            text.append(f"\n    → {f.remedy}", style="green")
    return text


class FindingsPanel(Static):
    """Lists findings, worst first."""

    _shown: list[Finding] | None = None  # what the panel shows now

    def show(self, found: list[Finding]) -> None:
        """Redraw with *found* (nothing to do when they did not change: the usual case at
        every redraw, since the diagnosis runs at most once a second)."""
        if found == self._shown:
            return
        self._shown = list(found)
        self.border_title = f"findings ({len(found)})"
        self.update(findings_text(found))
