"""Help screen (`?`): every key, nvitop-like, and what the marks and colours mean."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP_TEXT = """\
[b]ddptop keys[/b]

  ↑ ↓ PgUp PgDn   move the cursor          space   select/unselect rank (for s)
  Enter           rank detail              s       stacks of selected (or all) ranks, grouped
  < >             sort by previous / next column        o   reverse sort order
  /               filter: rank (3), range (0-7), host, status or flag; empty clears
  p               pause / resume updates   r       refresh now
  e               export a diagnosis bundle (or a JSON snapshot)
  g               from 1,024 ranks: odd ranks first / by node / status / collective / all
  ?               this help                q       quit (Escape closes screens)

[b]replay[/b]   ← →  step one recorded moment   Home End  start / end
          f  jump to the first finding   space  play / pause   + -  speed

[b]flags[/b] (always a word, colour only repeats it)
  ✓ in step   ⚠ LAG-SEQ / LAG-STEP behind the leader and not moving
  MISMATCH  in a different collective than its peers at the same seq
  BATCHES   batches_per_epoch differs from the other ranks
  STALE silent 5 s / found stuck   LOST connection gone   CRASHED died (see detail)

[b]GPU colours[/b] (nvitop)  util green <10% yellow <75% red;  mem green <10% yellow <80% red
"""


class HelpScreen(ModalScreen[None]):
    """A modal list of keys; any of Escape, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        """The help text in a scrollable box."""
        with VerticalScroll(id="help-box"):
            yield Static(HELP_TEXT, id="help-text")
