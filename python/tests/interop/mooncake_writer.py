"""What a Mooncake sender (the 0.3.13 wheel) does to the bytes of a
notification's name or message, as measured against it (docs/wire.md).

Its JSON writer (jsoncpp) escapes every byte above 0x7f as `\\uXXXX`, reading
the bytes as UTF-8 without checking them: a lead byte takes the next 1-3
bytes whatever they are. Valid UTF-8 below U+40000 survives; anything else
changes. `received(data)` is what the other end decodes from what the wheel
writes for `data`: the tests check pdx receives exactly that.
"""

from __future__ import annotations

REPLACEMENT = 0xFFFD


def _code_units(data: bytes) -> list[int]:
    """The `\\uXXXX` values (and plain bytes below 0x80) the wheel writes."""
    units: list[int] = []

    def emit(cp: int) -> None:
        if cp < 0x10000:
            units.append(cp)
        else:
            # A surrogate pair, the high half kept to 16 bits.
            c = cp - 0x10000
            units.append(((c >> 10) + 0xD800) & 0xFFFF)
            units.append((c & 0x3FF) + 0xDC00)

    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            units.append(b)
            i += 1
        elif b < 0xE0:  # 0x80-0xdf: a two-byte reading (continuation bytes too)
            if n - i < 2:
                emit(REPLACEMENT)
                i += 1
                continue
            cp = ((b & 0x1F) << 6) | (data[i + 1] & 0x3F)
            i += 2
            emit(REPLACEMENT if cp < 0x80 else cp)
        elif b < 0xF0:
            if n - i < 3:
                emit(REPLACEMENT)
                i += 1
                continue
            cp = ((b & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F)
            i += 3
            emit(REPLACEMENT if cp < 0x800 or 0xD800 <= cp <= 0xDFFF else cp)
        elif b < 0xF8:
            if n - i < 4:
                emit(REPLACEMENT)
                i += 1
                continue
            # The wheel shifts the lead byte's bits by 24, not 18: only
            # U+10000..U+3FFFF (lead 0xf0) come out right.
            cp = ((b & 0x07) << 24) | ((data[i + 1] & 0x3F) << 12) | ((data[i + 2] & 0x3F) << 6) | (data[i + 3] & 0x3F)
            i += 4
            emit(REPLACEMENT if cp < 0x10000 else cp)
        else:
            emit(REPLACEMENT)
            i += 1
    return units


def received(data: bytes) -> bytes:
    """The bytes a receiver decodes from the string the wheel writes for
    `data`: a high and low surrogate pair joined, a lone surrogate kept as its
    three bytes (as Mooncake's and pdx's readers keep it)."""
    units = _code_units(data)
    out = bytearray()
    j = 0
    while j < len(units):
        u = units[j]
        if 0xD800 <= u <= 0xDBFF and j + 1 < len(units) and 0xDC00 <= units[j + 1] <= 0xDFFF:
            out += chr(0x10000 + ((u - 0xD800) << 10) + (units[j + 1] - 0xDC00)).encode()
            j += 2
        else:
            out += chr(u).encode("utf-8", "surrogatepass")
            j += 1
    return bytes(out)
