"""HPACK (RFC 7541) decoding of the header blocks kube-scheduler's HTTP/2 client sends.

Why not the hpack library: its Decoder took 24 us a block of kube-scheduler's (fields found in the tables, one
content-length literal), three blocks a pod, in Python calls and a debug log line per integer. Here a field in the
tables is a tuple read, and a Huffman string is read four bits at a time by a table made at import, its result
remembered (content lengths repeat). Only decoding: answers are encoded without the dynamic table (http2.py).

Bounds, for input from outside: the dynamic table by the size this server allows (SETTINGS_HEADER_TABLE_SIZE is never
sent, so HTTP/2's 4,096 bytes), changed only at a block's start; a decoded list by `max_list_size`, counted as RFC
9113 6.5.2 counts it; integers by MAX_INTEGER; a string by the block's own bytes; Huffman padding checked as RFC
7541 5.2 says. A block that breaks any of these, or the RFC, raises CompressionError or HeaderListTooLarge; both
close the connection.
"""

from __future__ import annotations

TABLE_SIZE = 4096
"""The dynamic table's size this server allows: HTTP/2's initial SETTINGS_HEADER_TABLE_SIZE (RFC 9113 6.5.2)."""

MAX_INTEGER = 1 << 21
"""The largest integer a block may carry (an index or a length): past a block's or a table's size."""

HUFFMAN_KEPT = 512
"""Huffman strings remembered with what they decode to, then forgotten all at once."""

Field = tuple[bytes, bytes]


class CompressionError(ValueError):
    """The block does not decode: COMPRESSION_ERROR (RFC 9113 4.3)."""


class HeaderListTooLarge(ValueError):
    """The decoded list is over the limit this server set (SETTINGS_MAX_HEADER_LIST_SIZE)."""


_STATIC: tuple[Field, ...] = (
    (b':authority', b''),
    (b':method', b'GET'),
    (b':method', b'POST'),
    (b':path', b'/'),
    (b':path', b'/index.html'),
    (b':scheme', b'http'),
    (b':scheme', b'https'),
    (b':status', b'200'),
    (b':status', b'204'),
    (b':status', b'206'),
    (b':status', b'304'),
    (b':status', b'400'),
    (b':status', b'404'),
    (b':status', b'500'),
    (b'accept-charset', b''),
    (b'accept-encoding', b'gzip, deflate'),
    (b'accept-language', b''),
    (b'accept-ranges', b''),
    (b'accept', b''),
    (b'access-control-allow-origin', b''),
    (b'age', b''),
    (b'allow', b''),
    (b'authorization', b''),
    (b'cache-control', b''),
    (b'content-disposition', b''),
    (b'content-encoding', b''),
    (b'content-language', b''),
    (b'content-length', b''),
    (b'content-location', b''),
    (b'content-range', b''),
    (b'content-type', b''),
    (b'cookie', b''),
    (b'date', b''),
    (b'etag', b''),
    (b'expect', b''),
    (b'expires', b''),
    (b'from', b''),
    (b'host', b''),
    (b'if-match', b''),
    (b'if-modified-since', b''),
    (b'if-none-match', b''),
    (b'if-range', b''),
    (b'if-unmodified-since', b''),
    (b'last-modified', b''),
    (b'link', b''),
    (b'location', b''),
    (b'max-forwards', b''),
    (b'proxy-authenticate', b''),
    (b'proxy-authorization', b''),
    (b'range', b''),
    (b'referer', b''),
    (b'refresh', b''),
    (b'retry-after', b''),
    (b'server', b''),
    (b'set-cookie', b''),
    (b'strict-transport-security', b''),
    (b'transfer-encoding', b''),
    (b'user-agent', b''),
    (b'vary', b''),
    (b'via', b''),
    (b'www-authenticate', b''),
)
"""RFC 7541 Appendix A: the static table, indices 1 to 61."""

_CODES: tuple[tuple[int, int], ...] = (
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28), (0xfffffe5, 28),
    (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28),
    (0xfffffef, 28), (0xffffff0, 28), (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10),
    (0xf9, 8), (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), (0x1a, 6), (0x1b, 6),
    (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7),
    (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5),
    (0x25, 6), (0x26, 6), (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6), (0x76, 7),
    (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14),
    (0x1ffd, 13), (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22), (0x7fffda, 23),
    (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23),
    (0x7fffe2, 23), (0x7fffe3, 23), (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), (0x1fffdf, 21), (0x3fffdf, 22),
    (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22),
    (0x3fffe3, 22), (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22), (0x7ffff2, 23),
    (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21),
    (0x3ffffe6, 26), (0x7ffffe0, 27), (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23), (0x3fffea, 22), (0x3fffeb, 22),
    (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27),
    (0x7ffffe9, 27), (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26), (0x3fffffff, 30),
)
"""RFC 7541 Appendix B: each symbol's Huffman code and its length in bits, 0 to 255 and EOS (256)."""

EOS = 256


def _machine() -> tuple[tuple[tuple[int, int], ...], frozenset[int]]:
    """The Huffman code as a machine read four bits at a time: for each (state, nibble), the next state (-1: the
    nibble completes EOS, an error) and the byte it completes (-1: none; a nibble completes at most one, as no
    code is shorter than five bits). A state is a node of the code's tree below which no symbol is complete yet;
    the states where a string may end are the root and those reached by at most seven 1 bits, EOS's own prefix
    (the padding RFC 7541 5.2 allows)."""
    children: list[list[int]] = [[0, 0]]  # internal nodes; a child is another node's number, or ~symbol
    for symbol, (code, length) in enumerate(_CODES):
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = (code >> shift) & 1
            if children[node][bit] == 0:
                children.append([0, 0])
                children[node][bit] = len(children) - 1
            node = children[node][bit]
        children[node][code & 1] = ~symbol
    table = []
    for state in range(len(children)):
        for nibble in range(16):
            node, completed = state, -1
            for shift in (3, 2, 1, 0):
                child = children[node][(nibble >> shift) & 1]
                if child < 0:
                    completed, node = ~child, 0
                    if completed == EOS:
                        break
                else:
                    node = child
            table.append((-1, -1) if completed == EOS else (node, completed))
    padding, node = {0}, 0
    for _ in range(7):
        node = children[node][1]
        padding.add(node)
    return tuple(table), frozenset(padding)


_MACHINE, _PADDING = _machine()


class HpackDecoder:
    """One connection's decoder: its dynamic table follows the client's, so every block is decoded in order."""

    __slots__ = ("_table", "_size", "_max_size", "_max_list", "_strings")

    def __init__(self, max_list_size: int) -> None:
        self._table: list[Field] = []  # newest first: index 62 is its first entry
        self._size = 0
        self._max_size = TABLE_SIZE
        self._max_list = max_list_size
        self._strings: dict[bytes, bytes] = {}

    def decode(self, block: bytes) -> list[Field]:
        try:
            return self._decode(block)
        except IndexError:
            raise CompressionError("the block ends within a field") from None

    def _decode(self, block: bytes) -> list[Field]:
        fields: list[Field] = []
        listed, position, end = 0, 0, len(block)
        while position < end:
            byte = block[position]
            position += 1
            if byte & 0x80:  # indexed (6.1)
                index = byte & 0x7F
                if index == 0x7F:
                    index, position = _integer(block, position, index)
                field = self._field(index)
            elif byte & 0x40:  # literal with incremental indexing (6.2.1)
                field, position = self._literal(block, position, byte & 0x3F, 0x3F)
                self._add(field)
            elif byte & 0x20:  # dynamic table size update (6.3)
                if fields:
                    raise CompressionError("a table size update after a field")
                size = byte & 0x1F
                if size == 0x1F:
                    size, position = _integer(block, position, size)
                if size > TABLE_SIZE:
                    raise CompressionError(f"a table size of {size} bytes, over the {TABLE_SIZE} allowed")
                self._max_size = size
                self._evict(0)
                continue
            else:  # literal without indexing or never indexed (6.2.2, 6.2.3)
                field, position = self._literal(block, position, byte & 0x0F, 0x0F)
            listed += _entry_size(field)
            if listed > self._max_list:
                raise HeaderListTooLarge(f"headers over {self._max_list} bytes")
            fields.append(field)
        return fields

    def _field(self, index: int) -> Field:
        if 0 < index <= len(_STATIC):
            return _STATIC[index - 1]
        at = index - len(_STATIC) - 1
        if 0 <= at < len(self._table):
            return self._table[at]
        raise CompressionError(f"index {index} is in neither table")

    def _literal(self, block: bytes, position: int, index: int, full: int) -> tuple[Field, int]:
        """A literal field (6.2) whose first byte gave `index`, `full` if its prefix was: its name by index, or a
        string where the index is 0, then its value."""
        if index == full:
            index, position = _integer(block, position, index)
        if index:
            name = self._field(index)[0]
        else:
            name, position = self._string(block, position)
        value, position = self._string(block, position)
        return (name, value), position

    def _string(self, block: bytes, position: int) -> tuple[bytes, int]:
        byte = block[position]
        length = byte & 0x7F
        position += 1
        if length == 0x7F:
            length, position = _integer(block, position, length)
        end = position + length
        if end > len(block):
            raise CompressionError("a string longer than the block")
        raw = block[position:end]
        if not byte & 0x80:
            return raw, end
        decoded = self._strings.get(raw)
        if decoded is None:
            decoded = _huffman(raw)
            if len(self._strings) >= HUFFMAN_KEPT:
                self._strings.clear()
            self._strings[raw] = decoded
        return decoded, end

    def _add(self, field: Field) -> None:
        size = _entry_size(field)
        if size > self._max_size:  # empties the table, and is not added (4.4)
            self._table.clear()
            self._size = 0
            return
        self._evict(size)
        self._table.insert(0, field)
        self._size += size

    def _evict(self, room: int) -> None:
        """Oldest entries out until `room` bytes more fit within the table's size."""
        while self._size + room > self._max_size:
            self._size -= _entry_size(self._table.pop())


def _entry_size(field: Field) -> int:
    """A field's size as the dynamic table counts it (RFC 7541 4.1), and a header list (RFC 9113 6.5.2)."""
    return len(field[0]) + len(field[1]) + 32


def _integer(block: bytes, position: int, value: int) -> tuple[int, int]:
    """The rest of an integer whose prefix was full (5.1)."""
    shift = 0
    while True:
        byte = block[position]
        position += 1
        value += (byte & 0x7F) << shift
        if value > MAX_INTEGER:
            raise CompressionError(f"an integer over {MAX_INTEGER}")
        if not byte & 0x80:
            return value, position
        shift += 7


def _huffman(encoded: bytes) -> bytes:
    decoded = bytearray()
    machine, state = _MACHINE, 0
    for byte in encoded:
        state, completed = machine[state << 4 | byte >> 4]
        if state < 0:
            raise CompressionError("a Huffman string holds EOS")
        if completed >= 0:
            decoded.append(completed)
        state, completed = machine[state << 4 | byte & 0x0F]
        if state < 0:
            raise CompressionError("a Huffman string holds EOS")
        if completed >= 0:
            decoded.append(completed)
    if state not in _PADDING:
        raise CompressionError("a Huffman string padded with other than at most seven 1 bits")
    return bytes(decoded)
