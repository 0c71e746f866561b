import gzip
import subprocess
import zlib

import pytest

from serve_app.fullvocab.compression import GzipJoiner, accepts_gzip, deflate_part


@pytest.mark.parametrize("header, accepted", [
    ("gzip", True), ("gzip, deflate, br", True), ("deflate, gzip;q=0.5", True), ("*", True),
    ("gzip;q=0", False), ("identity", False), ("", False), (None, False), ("GZIP", True),
])
def test_accepts_gzip(header, accepted):
    assert accepts_gzip(header) is accepted


def joined(pieces: list[bytes]) -> bytes:
    joiner = GzipJoiner()
    return b"".join(joiner.add(deflate_part(p)) for p in pieces) + joiner.end()


PIECES = [b'{"a":', b"1" * 100_000, b"", bytes(range(256)) * 300, b"}"]


def test_parts_deflated_apart_join_into_one_gzip_member():
    body = joined(PIECES)
    assert gzip.decompress(body) == b"".join(PIECES)
    reader = zlib.decompressobj(16 + zlib.MAX_WBITS)  # one member, then nothing
    assert reader.decompress(body) == b"".join(PIECES) and reader.eof and not reader.unused_data


def test_the_gzip_tool_checks_the_crc_and_length():
    result = subprocess.run(["gzip", "-t"], input=joined(PIECES), capture_output=True)
    assert result.returncode == 0, result.stderr
    damaged = bytearray(joined(PIECES))
    damaged[-8] ^= 1  # the CRC
    assert subprocess.run(["gzip", "-t"], input=bytes(damaged), capture_output=True).returncode


def test_an_empty_body_is_a_valid_gzip_member():
    assert gzip.decompress(joined([])) == b""
