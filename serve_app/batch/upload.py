"""POST /v1/files' multipart body, parsed as it arrives: the file part written straight to its
target and refused once past the cap, never held in memory; the small fields kept."""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header

from serve_app.errors import APIError

FIELD_LIMIT = 1024  # bytes of a text field (`purpose`)


def invalid_upload(message: str) -> APIError:
    return APIError(400, "invalid_upload", message)


def too_large(limit: int) -> APIError:
    return APIError(413, "file_too_large", f"the file has more than {limit} bytes, the most this "
                    "service takes (batch.max_file_bytes)", "file")


@dataclass
class Upload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None  # None: no file part came
    size: int = 0


@dataclass
class Parts:
    """The parser's callbacks: each part's headers, then its data to the file or a field."""

    sink: BinaryIO
    limit: int
    upload: Upload = field(default_factory=Upload)
    header: list[bytes] = field(default_factory=lambda: [b"", b""])
    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    is_file: bool = False
    value: bytearray = field(default_factory=bytearray)

    def callbacks(self) -> dict:
        return {"on_part_begin": self.begin, "on_header_field": self.header_field,
                "on_header_value": self.header_value, "on_header_end": self.header_end,
                "on_headers_finished": self.headers_finished, "on_part_data": self.data,
                "on_part_end": self.end}

    def begin(self) -> None:
        self.headers, self.value = {}, bytearray()

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self.header[0] += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self.header[1] += data[start:end]

    def header_end(self) -> None:
        self.headers[self.header[0].strip().lower()] = self.header[1].strip()
        self.header = [b"", b""]

    def headers_finished(self) -> None:
        disposition, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        if disposition != b"form-data" or b"name" not in options:
            raise invalid_upload("every part needs Content-Disposition: form-data with a name")
        self.name = options[b"name"].decode("utf-8", "replace")
        self.is_file = b"filename" in options
        if self.is_file:
            if self.upload.filename is not None:
                raise invalid_upload("send one file per upload")
            self.upload.filename = options[b"filename"].decode("utf-8", "replace") or "upload.jsonl"

    def data(self, data: bytes, start: int, end: int) -> None:
        if self.is_file:
            self.upload.size += end - start
            if self.upload.size > self.limit:
                raise too_large(self.limit)
            self.sink.write(data[start:end])
            return
        self.value += data[start:end]
        if len(self.value) > FIELD_LIMIT:
            raise invalid_upload(f"the field {self.name!r} is longer than {FIELD_LIMIT} bytes")

    def end(self) -> None:
        if not self.is_file:
            self.upload.fields[self.name] = self.value.decode("utf-8", "replace")


async def receive_upload(chunks: AsyncIterator[bytes], content_type: str | None, target: Path,
                         limit: int) -> Upload:
    """The upload's fields and file, the file's bytes written to `target` as they come."""
    media, options = parse_options_header(content_type or "")
    if media != b"multipart/form-data" or not options.get(b"boundary"):
        raise APIError(415, "unsupported_media_type",
                       f"upload a file as multipart/form-data, got {content_type!r}")
    with target.open("wb") as sink:
        parts = Parts(sink, limit)
        parser = MultipartParser(options[b"boundary"], parts.callbacks())
        try:
            async for chunk in chunks:
                parser.write(chunk)
            parser.finalize()
        except MultipartParseError as error:
            raise invalid_upload(f"the multipart body cannot be read: {error}") from None
    return parts.upload
