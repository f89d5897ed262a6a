"""HPACK decoding (extender/server/hpack_decoder.py): RFC 7541's own examples, blocks made by the hpack library's
encoder over many requests (its dynamic table followed block after block), and every way a block can break the RFC
or the bounds, which raises one of the decoder's two errors and nothing else."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.server.hpack_decoder import (
    HUFFMAN_KEPT,
    MAX_INTEGER,
    TABLE_SIZE,
    CompressionError,
    HeaderListTooLarge,
    HpackDecoder,
)
from extender.server.serve import Limits

LIMIT = 64 << 10

# RFC 7541 C.3 (without Huffman) and C.4 (with), three requests on one connection each.
EXAMPLE_FIELDS = [
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")],
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com"),
     (b"cache-control", b"no-cache")],
    [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"), (b":authority", b"www.example.com"),
     (b"custom-key", b"custom-value")],
]
EXAMPLES = {
    "C.3": ["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
            "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"],
    "C.4": ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
            "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"],
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_rfcs_examples_decode_as_it_says(example: str) -> None:
    decoder = HpackDecoder(LIMIT)
    assert [decoder.decode(bytes.fromhex(block)) for block in EXAMPLES[example]] == EXAMPLE_FIELDS


def _kube_scheduler(path: bytes, length: int) -> list[tuple[bytes, bytes]]:
    """What Go's HTTP/2 client sends for an extender's POST, in its order."""
    return [(b":authority", b"gpu-topology-extender.gpu-topology-system.svc:443"), (b":method", b"POST"),
            (b":path", path), (b":scheme", b"https"), (b"content-type", b"application/json"),
            (b"content-length", b"%d" % length), (b"accept-encoding", b"gzip"),
            (b"user-agent", b"kube-scheduler/v1.36.2 (linux/amd64) kubernetes/0b7d0a1")]


def test_a_connections_requests_decode_with_the_table_they_fill() -> None:
    encoder, decoder = hpack.Encoder(), HpackDecoder(LIMIT)
    for number in range(2000):
        fields = _kube_scheduler((b"/filter", b"/prioritize", b"/bind")[number % 3], 200 + 37 * number)
        block = encoder.encode(fields, huffman=number % 2 == 0)
        assert decoder.decode(block) == fields
    assert len(block) < 20, "by then the fields are found in the tables"


_OCTETS = st.binary(max_size=40)
_FIELD = st.tuples(st.one_of(st.sampled_from([b":path", b"content-length", b"x-a", b"accept"]), _OCTETS), _OCTETS)


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(st.tuples(st.lists(_FIELD, max_size=12), st.booleans(),
                                 st.sampled_from([None, 0, 64, 256, TABLE_SIZE]),
                                 st.booleans()), min_size=1, max_size=12))
def test_any_fields_the_encoder_writes_decode_to_themselves(
        blocks: list[tuple[list[tuple[bytes, bytes]], bool, int | None, bool]]) -> None:
    """Every representation: indexed, literal with and without indexing, never indexed (sensitive), Huffman or
    not, and table size updates that evict."""
    encoder, decoder = hpack.Encoder(), HpackDecoder(LIMIT)
    for fields, huffman, table_size, sensitive in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        written = [hpack.NeverIndexedHeaderTuple(*field) if sensitive else field for field in fields]
        assert decoder.decode(encoder.encode(written, huffman=huffman)) == fields


@settings(max_examples=500, deadline=None)
@given(block=st.binary(max_size=64), after=st.binary(max_size=16))
def test_any_bytes_decode_or_raise_the_decoders_errors_only(block: bytes, after: bytes) -> None:
    decoder = HpackDecoder(1024)
    for bytes_ in (block, after):  # the second after whatever the first left in the table
        try:
            fields = decoder.decode(bytes_)
        except (CompressionError, HeaderListTooLarge):
            continue
        assert sum(len(name) + len(value) + 32 for name, value in fields) <= 1024


def _literal(name: bytes, value: bytes, first: int = 0x40) -> bytes:
    """A literal field of a new name, without Huffman (first: 0x40 indexed, 0x00 not); strings under 127 bytes."""
    return bytes([first, len(name)]) + name + bytes([len(value)]) + value


@pytest.mark.parametrize(("block", "why"), [
    ("80", "index 0 is in neither table"),
    ("be", "index 62 is in neither table"),  # the dynamic table is empty
    ("ff80808001", "an integer over"),  # an index of 2**21 + 126, in four bytes
    ("ffffffffffff7f", "an integer over"),
    ("ff", "the block ends within a field"),
    ("40", "the block ends within a field"),
    ("400161057b", "a string longer than the block"),
    ("82" + "3fe11f", "a table size update after a field"),
    ("3fe21f", f"a table size of {TABLE_SIZE + 1} bytes"),
    # A literal named "a" whose value is one Huffman byte, or four.
    ("400161" + "81" + "61", "padded with other than"),  # "/" and then 01: a code cut short
    ("400161" + "81" + "ff", "padded with other than"),  # eight 1 bits of padding
    ("400161" + "81" + "fe", "padded with other than"),  # seven 1 bits and a 0
    ("400161" + "84" + "ffffffff", "holds EOS"),  # 32 1 bits: EOS is 30 of them
])
def test_a_block_that_breaks_the_rfc_is_refused_with_its_reason(block: str, why: str) -> None:
    with pytest.raises(CompressionError, match=why):
        HpackDecoder(LIMIT).decode(bytes.fromhex(block))


def test_huffman_padding_of_up_to_seven_1_bits_is_read() -> None:
    for value in (b"a", b"ab", b"abc", b"0", b"/prioritize", bytes(range(256))):
        block = hpack.Encoder().encode([(b"x", value)], huffman=True)
        assert HpackDecoder(LIMIT).decode(block) == [(b"x", value)]


def test_a_list_over_the_limit_is_refused_as_the_rfc_counts_it() -> None:
    field = (b"a" * 10, b"b" * 58)  # 100 bytes as RFC 9113 6.5.2 counts a field
    block = _literal(*field, first=0x00)
    assert HpackDecoder(300).decode(block * 3) == [field] * 3
    with pytest.raises(HeaderListTooLarge):
        HpackDecoder(299).decode(block * 3)


def test_the_dynamic_table_keeps_to_its_size_and_evicts_the_oldest() -> None:
    decoder = HpackDecoder(LIMIT)
    fields = [(b"n%03d" % number, b"v" * 60) for number in range(64)]  # 96 bytes each: 42 fit in 4,096
    decoder.decode(b"".join(_literal(*field) for field in fields))
    newest_first = [decoder.decode(bytes([0x80 | 62 + at]))[0] for at in range(TABLE_SIZE // 96)]
    assert newest_first == fields[::-1][:TABLE_SIZE // 96]
    with pytest.raises(CompressionError, match="neither table"):
        decoder.decode(bytes([0x80 | 62 + TABLE_SIZE // 96]))
    decoder.decode(bytes.fromhex("20"))  # size 0: every entry out
    with pytest.raises(CompressionError, match="neither table"):
        decoder.decode(bytes([0x80 | 62]))


def test_a_field_larger_than_the_table_empties_it() -> None:
    decoder = HpackDecoder(LIMIT)
    decoder.decode(_literal(b"a", b"b"))
    decoder.decode(bytes.fromhex("3f11") + _literal(b"c", b"d" * 20))  # a table of 48 bytes; the field is 53
    with pytest.raises(CompressionError, match="index 62"):
        decoder.decode(bytes([0x80 | 62]))


def test_remembered_huffman_strings_are_bounded() -> None:
    encoder, decoder = hpack.Encoder(), HpackDecoder(LIMIT)
    for number in range(3 * HUFFMAN_KEPT):
        decoder.decode(encoder.encode([(b"content-length", b"%d" % number)], huffman=True))
        assert len(decoder._strings) <= HUFFMAN_KEPT


def test_the_integer_bound_is_past_any_block_the_server_takes_or_table() -> None:
    assert MAX_INTEGER > Limits().max_head_bytes and MAX_INTEGER > TABLE_SIZE
