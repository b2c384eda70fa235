"""The stack's S3 endpoint: moto's server, with its three whole-object copies streamed.

    python -m lab.stack.s3server -H 127.0.0.1 -p 15900     (what `rtrl stack up` starts as the s3 part)

moto keeps each object in a spooled temp file (in memory up to 5 MB, then on disk: TMPDIR, which the stack
points at var/stack/s3), but three of its code paths copy a whole object into bytes:
- completing a multipart upload joins every part into one bytearray, then copies it (`FakeMultipart.complete`);
- a copy reads the source whole (`copy_object`: s3fs's `mv`, which publishes the lake's atomic writes);
- a ranged GET reads the whole object, copies it, then slices out the range (`get_object`).
The lake's 10M-interaction window writes a 3.5 GB episodes file in parts and publishes it by a copy, and
DuckDB reads the raw files by ranges, so the unpatched server was OOM-killed at 15.7 GB on a 24 GB machine
(bench/harvest_scale.py, 2026-12-04). Here those three paths go spool file to spool file in 1 MB blocks and
a ranged GET reads only its range. Nothing else about moto changes; the patches are written against the
pinned moto==5.2.5, and tests/test_s3server.py checks their bytes against the client's.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import hashlib
import shutil
import sys
import tempfile
import threading
from importlib.util import find_spec

from moto import server
from moto.core.compat import HAS_CRT
from moto.s3.exceptions import EntityTooSmall, InvalidPart, MalformedXML
from moto.s3.models import FakeKey, FakeMultipart, MultipartChecksumBuilder, S3Backend
from moto.s3.responses import S3Response
from moto.settings import S3_UPLOAD_PART_MIN_SIZE, get_s3_default_key_buffer_size
from moto.utilities.utils import md5_hash

BLOCK = 2**20  # the copy loops' block: a 3.5 GB object never sits in memory
_local = threading.local()  # .lazy: FakeKey.value hands out a Body (get_object) or a Spool (copy_object)


class Spool:
    """An object's bytes in a spooled temp file, handed to FakeKey in place of bytes."""

    def __init__(self) -> None:
        self.file, self.size = tempfile.SpooledTemporaryFile(get_s3_default_key_buffer_size()), 0

    def append(self, key: FakeKey) -> None:
        with key.lock:
            key._value_buffer.seek(0)
            shutil.copyfileobj(key._value_buffer, self.file, BLOCK)
        self.size += key.contentsize


class Body:
    """A stored object as a GET's response body: len() and slices read only what they cover."""

    def __init__(self, key: FakeKey) -> None:
        self.key = key

    def __len__(self) -> int:
        return self.key.contentsize

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, s: slice) -> bytes:
        start, stop, _ = s.indices(len(self))
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))


_get_value, _set_value = FakeKey.value.fget, FakeKey.value.fset


def value_get(self: FakeKey):
    lazy = getattr(_local, "lazy", None)
    if lazy is Body:
        return Body(self)
    if lazy is Spool:
        spool = Spool()
        spool.append(self)
        return spool
    return _get_value(self)


def value_set(self: FakeKey, new_value) -> None:
    if not isinstance(new_value, Spool):
        return _set_value(self, new_value)
    self._value_buffer.close()
    self._value_buffer, self.contentsize = new_value.file, new_value.size


def _crc(algorithm: str):
    """(update(block, value), bytes) of a CRC as moto's compute_checksum picks it: CRC32C and CRC64NVME fall
    back to CRC32 without their libraries (crc32c, awscrt), as here; None for SHA1 and SHA256."""
    if algorithm == "CRC32C" and find_spec("crc32c"):
        import crc32c

        return crc32c.crc32c, 4
    if algorithm == "CRC64NVME" and HAS_CRT:
        from awscrt import checksums

        return checksums.crc64nvme, 8
    return (binascii.crc32, 4) if algorithm in ("CRC32", "CRC32C", "CRC64NVME") else None


def _full_checksum(spool: Spool, algorithm: str) -> str:
    """A completed upload's FULL_OBJECT checksum (CRC64NVME by default), in blocks: moto's builder keeps one
    more bytes copy of the whole object for it."""
    crc, value = _crc(algorithm), 0
    h = None if crc else hashlib.new("sha1" if algorithm == "SHA1" else "sha256")
    spool.file.seek(0)
    while block := spool.file.read(BLOCK):
        if crc:
            value = crc[0](block, value)
        else:
            h.update(block)
    return base64.b64encode(value.to_bytes(crc[1], "big") if crc else h.digest()).decode()


def complete(self: FakeMultipart, body):
    """FakeMultipart.complete with the same checks, etag and checksum, the parts joined in a Spool."""
    checksum = MultipartChecksumBuilder(self.metadata.get("x-amz-checksum-algorithm"),
                                        self.metadata.get("x-amz-checksum-type"))
    spool, md5s, last, count = Spool(), bytearray(), None, 0
    for pn, etag in body:
        part = self.parts.get(pn)
        if part is None or part.etag.replace('"', "") != etag.replace('"', ""):
            raise InvalidPart()
        if last is not None and last.contentsize < S3_UPLOAD_PART_MIN_SIZE:
            raise EntityTooSmall()
        md5s.extend(codecs.getdecoder("hex_codec")(part.etag.replace('"', ""))[0])
        spool.append(part)
        if checksum.checksum_type == "COMPOSITE":  # a checksum of the parts' checksums: one part at a time
            checksum.addPart(_get_value(part))
        last, count = part, count + 1
    if count == 0:
        raise MalformedXML
    etag = md5_hash()
    etag.update(bytes(md5s))
    details = checksum.build() if checksum.checksum_type == "COMPOSITE" else \
        (checksum.checksum_type, _full_checksum(spool, checksum.checksum_algorithm), 1)
    return spool, f"{etag.hexdigest()}-{count}", details


def lazily(kind, method):
    def wrapper(*args, **kwargs):
        _local.lazy = kind
        try:
            return method(*args, **kwargs)
        finally:
            _local.lazy = None
    wrapper.__wrapped__ = method
    return wrapper


_key_response = S3Response.key_response


def key_response(self: S3Response, request, full_url: str, headers):
    """A GET's Body becomes bytes here unless the range handler already sliced it (a non-ranged GET reads the
    object whole, as moto did)."""
    status, out_headers, content = _key_response(self, request, full_url, headers)
    return status, out_headers, content[:] if isinstance(content, Body) else content


def patch() -> None:
    if FakeKey.value.fget is value_get:  # already patched
        return
    FakeKey.value = property(value_get, value_set)
    FakeMultipart.complete = complete
    S3Backend.copy_object = lazily(Spool, S3Backend.copy_object)
    S3Response.get_object = lazily(Body, S3Response.get_object)
    S3Response.key_response = key_response


def main(argv: list[str] | None = None) -> None:
    patch()
    server.main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
