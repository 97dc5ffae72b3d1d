"""The error for a downstream task's file that is not UTF-8, shared by the task readers."""
from __future__ import annotations

from pathlib import Path

UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")


def not_utf8(path: Path, error: UnicodeDecodeError) -> ValueError:
    """A ValueError naming the file and the line of its first byte that is not UTF-8: the decoder's own error names
    neither, only a position in the chunk it was reading."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
        at = error.start  # the file changed since it was read: the reader's position is the best there is
    except UnicodeDecodeError as whole:
        at = whole.start
    line = data[:at].count(b"\n") + 1
    kind = "UTF-16 (it starts with a UTF-16 byte-order mark)" if data[:2] in UTF16_MARKS else \
        f"in another encoding (byte 0x{data[at]:02x} is not UTF-8; Latin-1 or Windows-1252?)"
    return ValueError(f"{path}:{line}: the file is {kind}; save it as UTF-8")
