"""HTML building with escaping by default, and the formats values are shown in.

Every page is built with :func:`h`: its template is trusted markup and every argument is escaped unless it
is :class:`Markup` (the result of another ``h``). So a key, value, header, topic or group name is escaped
wherever it lands, text or attribute (quotes included), and markup is never built by concatenating
unescaped strings.
"""

from __future__ import annotations

import datetime
import html
import json
import string
from typing import Iterable
from urllib.parse import quote, urlencode

FORMATS = ("auto", "text", "json", "hex")


class Markup(str):
    """A string that is already safe HTML."""

    __slots__ = ()


def escape(value: object) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def h(template: str, *args: object, **kwargs: object) -> Markup:
    """``template.format`` with every argument escaped unless it is Markup."""
    return Markup(template.format(*(escape(a) for a in args), **{k: escape(v) for k, v in kwargs.items()}))


def join(parts: Iterable[object], separator: str = "") -> Markup:
    return Markup(escape(separator).join(escape(p) for p in parts))


def url(path: str, *segments: str, **query: object) -> str:
    """A site-relative URL: path segments percent-encoded (any group name), then the query string. Pass
    the result through h() like any other value (it is escaped into the attribute)."""
    full = path + "".join("/" + quote(str(s), safe="") for s in segments)
    params = {k: v for k, v in query.items() if v is not None and v != ""}
    return full + ("?" + urlencode(params) if params else "")


def number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def size(value: int | None) -> str:
    if value is None:
        return "—"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{value} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{value} B"


def timestamp(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "—"
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}Z"


_PRINTABLE = set(string.printable) - set("\x0b\x0c")


def _as_text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if all(c in _PRINTABLE or ord(c) > 127 for c in text) else None


def hexdump(data: bytes) -> str:
    lines = []
    for start in range(0, len(data), 16):
        chunk = data[start:start + 16]
        hex_part = " ".join(f"{b:02x}" for b in chunk)
        text_part = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {hex_part:<47}  {text_part}")
    return "\n".join(lines)


def render_bytes(data: bytes | None, fmt: str = "auto", truncated: bool = False) -> tuple[str, str]:
    """(text to show, the format used) for a key or value: "null", "json" (pretty-printed), "text" or
    "hex". ``text`` decodes UTF-8 (bad bytes replaced); ``auto`` and ``json`` try JSON, then printable
    UTF-8 text, then hex. A value cut to the display limit is not pretty-printed (it would not parse)."""
    if data is None:
        return "null", "null"
    if fmt == "hex":
        return hexdump(data), "hex"
    if fmt == "text":
        return data.decode("utf-8", "replace"), "text"
    text = _as_text(data)
    if text is None:
        return hexdump(data), "hex"
    if not truncated and (fmt == "json" or text.lstrip()[:1] in ("{", "[")):
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False), "json"
        except ValueError:
            pass
    return text, "text"
