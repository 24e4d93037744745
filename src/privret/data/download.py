"""Download the public BEIR datasets from their official archives, checksum-verified.

Names, URLs and MD5 checksums are those published by the BEIR project in the "Available Datasets"
table of its README (github.com/beir-cellar/beir, README.md; the same table is on the project wiki
page "Datasets available"). Thakur et al. 2021, "BEIR: A Heterogeneous Benchmark for Zero-shot
Evaluation of Information Retrieval Models". Only the datasets the BEIR project distributes itself
are listed (BioASQ, Signal-1M, TREC-NEWS and Robust04 must be reproduced from their licensed sources).

The archive is streamed to a temporary file beside the target while its MD5 is computed; a checksum
mismatch deletes it and raises :class:`~privret.errors.InputError`. The archive is then unpacked into
a staged directory (member paths that would escape it are refused) and renamed into place, so
``<out>/<name>`` appears complete or not at all. Offline, the download fails with one clear error
that says how to fetch the file by hand and pass it with ``--archive``.
"""

from __future__ import annotations

import hashlib
import shutil
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from privret.errors import InputError
from privret.io import atomic_path

BEIR_BASE_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets"

# name -> MD5 of <name>.zip, from the BEIR project's published dataset table (see module doc).
BEIR_MD5 = {
    "msmarco": "444067daf65d982533ea17ebd59501e4",
    "trec-covid": "ce62140cb23feb9becf6270d0d1fe6d1",
    "nfcorpus": "a89dba18a62ef92f7d323ec890a0d38d",
    "nq": "d4d3d2e48787a744b6f6e691ff534307",
    "hotpotqa": "f412724f78b0d91183a0e86805e16114",
    "fiqa": "17918ed23cd04fb15047f73e6c3bd9d9",
    "arguana": "8ad3e3c2a5867cdced806d6503f29b99",
    "webis-touche2020": "46f650ba5a527fc69e0a6521c5a23563",
    "cqadupstack": "4e41456d7df8ee7760a7f866133bda78",
    "quora": "18fb154900ba42a600f84b839c173167",
    "dbpedia-entity": "c2a39eb420a3164af735795df012ac2c",
    "scidocs": "38121350fc3a4d2f48850f6aff52e4a9",
    "fever": "5a818580227bfb4b35bb6fa46d9b6c03",
    "climate-fever": "8b66f0a9126c521bae2bde127b4dc99d",
    "scifact": "5f7d1de60b170fc8027bb7898e2efca1",
}


@dataclass(frozen=True)
class Source:
    name: str
    url: str
    md5: str


def source(name: str, *, url: str | None = None, md5: str | None = None, local: bool = False) -> Source:
    """The official archive of ``name`` (``url``/``md5`` override it, e.g. for a mirror).

    ``local``: the archive is a file given by hand, so an unknown name needs only ``md5``.
    """
    if name not in BEIR_MD5 and (md5 is None or (url is None and not local)):
        raise InputError(f"unknown BEIR dataset '{name}' (known: {', '.join(sorted(BEIR_MD5))}); "
                         "another archive needs its md5, and a url or a local archive", field="NAME")
    checksum = (md5 or BEIR_MD5[name]).lower()
    if len(checksum) != 32 or any(c not in "0123456789abcdef" for c in checksum):
        raise InputError(f"'{md5}' is not an MD5 hex digest", field="md5")
    return Source(name, url or (f"{BEIR_BASE_URL}/{name}.zip" if name in BEIR_MD5 else ""), checksum)


def md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(src: Source, target: Path, *, timeout: float = 60.0, chunk: int = 1 << 20) -> str:
    """Stream ``src.url`` to ``target`` with a progress bar; return the MD5 of what was received."""
    from privret.progress import Progress

    digest = hashlib.md5(usedforsecurity=False)
    try:
        response = urllib.request.urlopen(src.url, timeout=timeout)  # noqa: S310 - http(s)/file URLs by design
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise InputError(
            f"cannot download {src.url} ({reason}); offline? fetch the archive on a machine with network "
            f"(md5 {src.md5}) and give it as the local archive", field="archive") from None
    with response, open(target, "wb") as sink, Progress() as progress:
        length = response.headers.get("Content-Length") if hasattr(response, "headers") else None
        task = progress.add_task(f"downloading {src.name}", total=int(length) if length else None)
        try:
            for block in iter(lambda: response.read(chunk), b""):
                sink.write(block)
                digest.update(block)
                progress.advance(task, len(block))
        except (urllib.error.URLError, OSError) as err:
            raise InputError(f"download of {src.url} interrupted ({err})", field="NAME") from None
    return digest.hexdigest()


def _safe_members(archive: zipfile.ZipFile, path: Path) -> list[zipfile.ZipInfo]:
    members = []
    for info in archive.infolist():
        parts = PurePosixPath(info.filename).parts
        if info.filename.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
            raise InputError(f"archive member '{info.filename}' would escape the target directory", path=path)
        members.append(info)
    return members


def extract(archive_path: Path, name: str, target: Path) -> Path:
    """Unpack a BEIR archive (``<name>/...`` inside) so that ``target`` holds the dataset files."""
    try:
        archive = zipfile.ZipFile(archive_path)
    except zipfile.BadZipFile:
        raise InputError("not a zip archive", path=archive_path) from None
    with archive, atomic_path(target) as staged:
        unpack = staged.with_name(staged.name + ".unpack")
        unpack.mkdir()
        for info in _safe_members(archive, archive_path):
            archive.extract(info, unpack)
        top = [p for p in unpack.iterdir() if not p.name.startswith("__MACOSX")]
        root = top[0] if len(top) == 1 and top[0].is_dir() else unpack
        root.rename(staged)
        shutil.rmtree(unpack, ignore_errors=True)
    return target


def download_dataset(name: str, out_dir: str | Path, *, url: str | None = None, md5: str | None = None,
                     archive: str | Path | None = None, keep_archive: bool = False, force: bool = False) -> dict:
    """Download (or take ``archive``), verify the MD5, unpack to ``<out_dir>/<name>``; return a summary."""
    src = source(name, url=url, md5=md5, local=archive is not None)
    out_dir = Path(out_dir)
    target = out_dir / name
    if target.exists() and not force:
        return {"name": name, "path": str(target), "status": "present", "md5": None, "url": src.url}
    out_dir.mkdir(parents=True, exist_ok=True)
    if archive is not None:
        archive = Path(archive)
        if not archive.is_file():
            raise InputError("archive not found", path=archive, field="archive")
        received = md5_of(archive)
        if received != src.md5:
            raise InputError(f"checksum mismatch: md5 {received}, expected {src.md5} (corrupt or wrong file)",
                             path=archive)
        extract(archive, name, target)
        return {"name": name, "path": str(target), "status": "unpacked", "md5": received, "url": None}

    partial = out_dir / f".{name}.zip.partial"
    try:
        received = fetch(src, partial)
        if received != src.md5:
            raise InputError(f"checksum mismatch for {src.url}: md5 {received}, expected {src.md5} "
                             "(corrupt or changed download; nothing was written)", field="NAME")
        extract(partial, name, target)
        if keep_archive:
            partial.replace(out_dir / f"{name}.zip")
    finally:
        partial.unlink(missing_ok=True)
    return {"name": name, "path": str(target), "status": "downloaded", "md5": received, "url": src.url}
