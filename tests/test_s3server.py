"""The stack's S3 endpoint (lab/stack/s3server.py): moto's server with its whole-object copies streamed.

A real server process driven by s3fs (the lake's own client): a multipart upload, s3fs's `mv` (a copy) and
ranged reads return the bytes written. In-process, the three paths allocate less than the object's size,
where moto alone holds a completed upload twice, a copy once and the whole object per ranged read."""

from __future__ import annotations

import os
import sys
import tracemalloc

import boto3
import botocore.exceptions
import pytest

from rl_core.runtime import procs

s3fs = pytest.importorskip("s3fs")

MB = 2**20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port, spool = procs.free_port(), tmp_path_factory.mktemp("s3spool")
    endpoint, log = f"http://127.0.0.1:{port}", spool / "s3server.log"
    proc = procs.start([sys.executable, "-m", "lab.stack.s3server", "-H", "127.0.0.1", "-p", str(port)],
                       {**os.environ, "TMPDIR": str(spool)}, log)
    procs.wait_http(f"{endpoint}/moto-api/", 60, proc, log)  # the stack's own health check
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                      region_name="us-east-1")
    s3.create_bucket(Bucket="lake")
    fs = s3fs.S3FileSystem(key="k", secret="s", client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
                           skip_instance_cache=True)
    yield proc, fs, s3
    procs.stop(proc)


def test_multipart_copy_and_ranges_round_trip(server):
    _, fs, _ = server
    data = os.urandom(24 * MB)
    with fs.open("lake/.tmp-big.bin", "wb", block_size=5 * MB) as f:  # 5 parts, as the lake streams
        for i in range(0, len(data), 3 * MB):
            f.write(data[i:i + 3 * MB])
    fs.mv("lake/.tmp-big.bin", "lake/big.bin")  # the lake's publish: a server-side copy, then a delete
    assert not fs.exists("lake/.tmp-big.bin")
    assert fs.info("lake/big.bin")["size"] == len(data)
    for start, end in ((0, 10), (17 * MB + 3, 17 * MB + 4096), (len(data) - 5, len(data))):
        assert fs.cat_file("lake/big.bin", start=start, end=end) == data[start:end]
    assert fs.cat_file("lake/big.bin") == data  # a plain GET still returns the whole object
    fs.pipe_file("lake/small.json", b"{}")  # a plain PUT, kept in memory by moto
    assert fs.cat_file("lake/small.json") == b"{}"


def test_the_whole_object_paths_allocate_less_than_the_object():
    """In-process (moto's mock, the same backend classes), Python's own allocations measured by tracemalloc:
    moto alone allocates the object twice to complete an upload, once to copy it, once per ranged read."""
    from moto import mock_aws
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.s3.utils import compute_checksum

    from lab.stack.s3server import patch

    patch()
    size, part = 96 * MB, 6 * MB
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
        s3.create_bucket(Bucket="lake")
        up = s3.create_multipart_upload(Bucket="lake", Key="big.bin")
        data = [os.urandom(part) for _ in range(size // part)]
        etags = [s3.upload_part(Bucket="lake", Key="big.bin", UploadId=up["UploadId"], PartNumber=i + 1,
                                Body=d)["ETag"] for i, d in enumerate(data)]
        parts = {"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]}
        calls = {
            "complete": lambda: s3.complete_multipart_upload(Bucket="lake", Key="big.bin", UploadId=up["UploadId"],
                                                             MultipartUpload=parts),
            "copy": lambda: s3.copy_object(Bucket="lake", Key="copy.bin", CopySource={"Bucket": "lake", "Key": "big.bin"}),
            "range": lambda: s3.get_object(Bucket="lake", Key="copy.bin", Range="bytes=1000-5095")["Body"].read(),
        }
        peaks = {}
        for name, call in calls.items():
            tracemalloc.start()
            out = call()
            peaks[name] = tracemalloc.get_traced_memory()[1] / MB
            tracemalloc.stop()
        assert len(out) == 4096
        assert s3.head_object(Bucket="lake", Key="copy.bin")["ContentLength"] == size
        key = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets["lake"].keys["big.bin"]
        # the full-object checksum (CRC64NVME, moto's default) as moto computes it over the joined bytes
        assert key.checksum_value == compute_checksum(b"".join(data), "CRC64NVME").decode()
    # 1 MB blocks (the joins, the checksum, a range) and 16 MB ones (moto's own etag of a copy): never the object
    assert max(peaks.values()) < size / MB / 2, peaks


def test_a_missing_or_mismatched_part_is_refused(server):
    _, _, s3 = server
    up = s3.create_multipart_upload(Bucket="lake", Key="bad.bin")
    part = s3.upload_part(Bucket="lake", Key="bad.bin", UploadId=up["UploadId"], PartNumber=1, Body=b"y" * 100)
    with pytest.raises(botocore.exceptions.ClientError, match="InvalidPart"):
        s3.complete_multipart_upload(Bucket="lake", Key="bad.bin", UploadId=up["UploadId"], MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}, {"PartNumber": 2, "ETag": '"0" '}]})
    done = s3.complete_multipart_upload(Bucket="lake", Key="bad.bin", UploadId=up["UploadId"],
                                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert done["ETag"].strip('"').endswith("-1")
    assert s3.get_object(Bucket="lake", Key="bad.bin")["Body"].read() == b"y" * 100


def test_the_s3_lake_fetches_what_its_readers_ask_for(server, monkeypatch):
    """The lake's S3 reads (DuckDB's scans, the harvest's row-group cursor) fetch the bytes asked for: s3fs's
    default read-ahead fetched the next 50 MB block with every read and kept it per open file, outside DuckDB's
    memory_limit (the 10M harvest from S3 peaked above the same harvest from disk: docs/benchmarks.md)."""
    import pyarrow as pa

    from rl_core.duck import connect
    from rl_core.lake import Lake

    _, _, s3 = server
    for k, v in {"AWS_ENDPOINT_URL": s3.meta.endpoint_url, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()  # an instance made before these variables would keep its endpoint
    lake = Lake("s3://lake/readahead")
    table = pa.table({"n": pa.array(range(200_000)), "blob": pa.array([os.urandom(64) for _ in range(200_000)])})
    path = lake.write_parquet("raw/t/part-0.parquet", table)  # ~13 MB, incompressible
    asked = []
    with lake.fs.open(path, "rb") as f:
        fetch = f.cache.fetcher
        f.cache.fetcher = lambda start, end: asked.append(end - start) or fetch(start, end)
        f.seek(1000)
        assert len(f.read(4096)) == 4096
    assert asked == [4096]  # read-ahead would have fetched 4096 + one block (the rest of this file)
    con = connect(lake)  # DuckDB reads through the same filesystem
    assert con.execute(f"SELECT count(*), sum(n) FROM read_parquet('{lake.url('raw/t/part-0.parquet')}')"
                       ).fetchone() == (200_000, sum(range(200_000)))
    s3fs.S3FileSystem.clear_instance_cache()
