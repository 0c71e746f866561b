import gzip

import pytest

from serve_app.compression import accepts_gzip, gzip_chunks


@pytest.mark.parametrize("header, accepted", [
    ("gzip", True), ("gzip, deflate, br", True), ("deflate, gzip;q=0.5", True), ("*", True),
    ("gzip;q=0", False), ("identity", False), ("", False), (None, False), ("GZIP", True),
])
def test_accepts_gzip(header, accepted):
    assert accepts_gzip(header) is accepted


def test_gzip_chunks_make_one_gzip_stream():
    chunks = [b'{"a":', b"1" * 100_000, b"}"]
    assert gzip.decompress(b"".join(gzip_chunks(chunks))) == b"".join(chunks)
