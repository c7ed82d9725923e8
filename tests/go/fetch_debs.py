"""Fetches the Debian packages pinned in debs.tsv (name, version, URL, SHA-256), checks each
one's digest, and extracts the Go sources they carry (under usr/share/gocode) into DEST.

Run by `cargo xtask tools` with the project's virtualenv Python; the standard library only
(a .deb is an `ar` archive whose `data.tar.*` member holds the files)."""

import hashlib
import io
import lzma
import os
import sys
import tarfile
import urllib.request


def ar_members(blob):
    """(name, bytes) of each member of an ar archive."""
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    at = 8
    while at + 60 <= len(blob):
        header = blob[at:at + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        at += 60
        yield name, blob[at:at + size]
        at += size + (size % 2)


def extract(blob, dest):
    for name, data in ar_members(blob):
        if not name.startswith("data.tar"):
            continue
        if name.endswith(".xz"):
            data = lzma.decompress(data)
        mode = "r:gz" if name.endswith(".gz") else "r:"
        with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:
            members = [m for m in tar.getmembers() if m.name.lstrip("./").startswith("usr/share/gocode/")]
            tar.extractall(dest, members=members, filter="data")
        return
    raise ValueError("no data.tar member")


def main(pins, cache, dest):
    os.makedirs(cache, exist_ok=True)
    os.makedirs(dest, exist_ok=True)
    with open(pins) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    for name, version, url, digest in rows:
        path = os.path.join(cache, os.path.basename(url))
        if not os.path.exists(path):
            with urllib.request.urlopen(url, timeout=60) as resp:
                blob = resp.read()
            tmp = path + ".part"
            with open(tmp, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        with open(path, "rb") as f:
            blob = f.read()
        got = hashlib.sha256(blob).hexdigest()
        if got != digest:
            os.remove(path)
            sys.exit(f"{name} {version}: SHA-256 {got} is not the pinned {digest} ({url})")
        extract(blob, dest)
    print(f"extracted {len(rows)} packages into {dest}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:4])
