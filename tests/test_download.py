"""`privret data download`: checksum-verified, atomic; served from loopback in tests (no internet)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import socket
import threading
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import run_cli
from privret.cli import app
from privret.data.beir import load_beir
from privret.data.download import BEIR_MD5, download_dataset, source
from privret.errors import InputError

FILES = {
    "toyset/corpus.jsonl": '{"_id": "d1", "title": "T", "text": "aspirin and the heart"}\n',
    "toyset/queries.jsonl": '{"_id": "q1", "text": "aspirin heart"}\n',
    "toyset/qrels/test.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\n",
}


def _zip(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return buffer.getvalue()


@pytest.fixture()
def served(tmp_path):
    """A loopback HTTP server over tmp_path/www holding toyset.zip; yields (base URL, archive bytes)."""
    www = tmp_path / "www"
    www.mkdir()
    blob = _zip(FILES)
    (www / "toyset.zip").write_bytes(blob)
    handler = functools.partial(_QuietHandler, directory=str(www))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", blob, www
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


def test_official_table_and_overrides():
    """Each known name resolves to its own archive under the official base and its own checksum; overrides
    replace exactly what they name; unknown names need a checksum and a place to fetch from."""
    assert len(set(BEIR_MD5.values())) == len(BEIR_MD5)  # no checksum pasted onto two datasets
    for name in ("scifact", "nfcorpus", "trec-covid"):
        src = source(name)
        assert src.url == f"https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
        assert src.md5 == BEIR_MD5[name] and src.name == name
    assert source("scifact").md5 == "5f7d1de60b170fc8027bb7898e2efca1"  # the BEIR table's value
    mirror = source("scifact", url="http://127.0.0.1/mirror.zip", md5="A" * 32)
    assert (mirror.url, mirror.md5) == ("http://127.0.0.1/mirror.zip", "a" * 32)  # hex digests compare lower-case
    assert source("scifact", md5="b" * 32).url.endswith("/scifact.zip")  # a new checksum keeps the official URL
    assert source("toy", md5="c" * 32, local=True).url == ""
    with pytest.raises(InputError, match="unknown BEIR dataset"):
        source("no-such-set")
    with pytest.raises(InputError, match="unknown BEIR dataset"):
        source("toy", md5="c" * 32)  # a checksum, but nowhere to fetch from
    with pytest.raises(InputError, match="not an MD5"):
        source("toy", url="http://127.0.0.1/x.zip", md5="xyz")
    with pytest.raises(InputError, match="not an MD5"):
        source("scifact", md5="g" * 32)


def test_download_verifies_and_unpacks(served, tmp_path):
    base, blob, _ = served
    info = download_dataset("toyset", tmp_path / "data", url=f"{base}/toyset.zip", md5=hashlib.md5(blob).hexdigest())
    assert info["status"] == "downloaded"
    dataset = load_beir(tmp_path / "data" / "toyset")
    assert dataset.queries == {"q1": "aspirin heart"} and set(dataset.qrels) == {"test"}
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["toyset"]  # no partial file left
    again = download_dataset("toyset", tmp_path / "data", url=f"{base}/toyset.zip", md5=hashlib.md5(blob).hexdigest())
    assert again["status"] == "present"


def test_corrupted_download_is_rejected_and_nothing_is_written(served, tmp_path):
    base, blob, www = served
    good_md5 = hashlib.md5(blob).hexdigest()
    corrupted = bytearray(blob)
    corrupted[len(corrupted) // 2] ^= 0xFF
    (www / "toyset.zip").write_bytes(bytes(corrupted))
    with pytest.raises(InputError, match="checksum mismatch"):
        download_dataset("toyset", tmp_path / "data", url=f"{base}/toyset.zip", md5=good_md5)
    assert list((tmp_path / "data").iterdir()) == []


def test_file_url_and_archive_option(tmp_path):
    blob = _zip(FILES)
    archive = tmp_path / "toyset.zip"
    archive.write_bytes(blob)
    md5 = hashlib.md5(blob).hexdigest()
    info = download_dataset("toyset", tmp_path / "a", url=archive.as_uri(), md5=md5)
    assert info["status"] == "downloaded" and (tmp_path / "a" / "toyset" / "corpus.jsonl").is_file()
    info = download_dataset("toyset", tmp_path / "b", archive=archive, md5=md5)
    assert info["status"] == "unpacked" and (tmp_path / "b" / "toyset" / "qrels" / "test.tsv").is_file()
    with pytest.raises(InputError, match="checksum mismatch"):
        download_dataset("toyset", tmp_path / "c", archive=archive, md5="0" * 32)
    assert not (tmp_path / "c" / "toyset").exists()


def test_archive_members_cannot_escape(tmp_path):
    blob = _zip({"toyset/corpus.jsonl": "{}\n", "../evil.txt": "x"})
    archive = tmp_path / "evil.zip"
    archive.write_bytes(blob)
    with pytest.raises(InputError, match="escape"):
        download_dataset("toyset", tmp_path / "out", archive=archive, md5=hashlib.md5(blob).hexdigest())
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out" / "toyset").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_is_one_clear_error_exit_2(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/scifact.zip"
    proc = run_cli("data", "download", "scifact", "--out", str(tmp_path / "data"), "--url", url)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot download" in lines[0] and "--archive" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data" / "scifact").exists()


def test_cli_download(served, tmp_path):
    base, blob, _ = served
    result = CliRunner().invoke(app, ["data", "download", "toyset", "--out", str(tmp_path / "d"), "--url",
                                      f"{base}/toyset.zip", "--md5", hashlib.md5(blob).hexdigest()])
    assert result.exit_code == 0, result.output
    assert "verified" in result.output and (Path(tmp_path / "d" / "toyset" / "corpus.jsonl")).is_file()
