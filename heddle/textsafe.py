"""Text from outside heddle, made safe to show on a terminal or write to a log.

A registry's error body, a tool's or a plugin's stderr, a model's answer, a remote API's reply
may carry terminal control sequences: shown raw they set the window title, clear the screen,
hide or rewrite lines, plant a hyperlink. Every line heddle writes for a person (its errors,
notes, warnings, a run's events, a wait's question, the server's log) passes `printable`:
escape sequences go whole, then every other control character but newline and tab, C1
controls and DEL included, and the bidirectional overrides that make text read other than it
is stored. With no control character left, no sequence can start, even across two writes.

JSON that heddle prints keeps its value exactly: json escapes C0 controls itself, and
`printable_json` escapes the rest as `\\uXXXX`.

Writing such a line never fails what it reports (`write_line`): a line that cannot be written
is dropped, and a stream whose reader has gone is pointed at /dev/null for the rest of the
process, so neither the next line nor the interpreter's last flush fails on it.
"""

from __future__ import annotations

import os
import re
from typing import IO

# ESC or its C1 form, then a CSI (parameters, intermediates, final), a terminated string
# (OSC, DCS, SOS, PM, APC: up to BEL or ST), or any other escape (intermediates, final). A
# string's body stops at the next introducer, so each character is scanned a bounded number of times.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x90\x98\x9b-\x9f]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]"
)
# What is left: C0 but tab and newline, DEL, C1, the bidirectional marks, embeddings,
# overrides and isolates.
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[{_CONTROL}]")
# In JSON text json.dumps wrote, C0 is escaped already and these appear only inside strings.
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every terminal control sequence and control character removed (newline
    and tab kept)."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub("", _SEQUENCE.sub("", text))


def printable_json(text: str) -> str:
    """JSON text (as json.dumps writes it, `ensure_ascii=False`) with the control characters
    json leaves raw escaped: the same value, nothing a terminal acts on."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def write_line(stream: IO[str] | None, text: str, *, end: str = "\n") -> None:
    """`text`, made printable, then `end`, on `stream`, flushed; never an error."""
    if stream is None:  # sys.stderr of a process started with its stderr closed
        return
    try:
        stream.write(printable(text) + end)
        stream.flush()
    except (BrokenPipeError, ConnectionResetError):  # its reader gone, for good
        _give_up(stream)
    except (OSError, ValueError):  # full for now, or closed: this line is lost
        pass


def _give_up(stream: IO[str]) -> None:
    """Point `stream`'s descriptor at /dev/null: what it still buffers, and all it is given
    later, is dropped there instead of failing again."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # not a descriptor (a test's capture), or nothing to open
        return
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
