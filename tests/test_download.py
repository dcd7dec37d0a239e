"""minialign.download against a local HTTP server on 127.0.0.1 (no internet needed): the
`server` fixture of conftest.py, whose path knobs tests/localhttp.py describes.
"""
import socket
import struct
import time
import zlib

import pytest
from PIL import Image

import minialign.machinery.images.photos as photos_module
from minialign.machinery.images.download import DownloadError, download, refuse_http
from minialign.machinery.images.photos import IMAGES_URL, MANIFEST, fetch_images, photo_url

from localhttp import TINY_BACKOFF, jpeg_bytes, random_bytes, sha256


# ---------------------------------------------------------------- download
def test_complete_download_checks_sha256_and_leaves_no_part(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(20_000)
    dest = tmp_path / "sub" / "a.bin"
    got = download(f"{server.url}/files/a.bin", dest, expected_size=len(data),
                   expected_sha256=sha256(data), progress=False)
    assert got == dest and dest.read_bytes() == data
    assert not (tmp_path / "sub" / "a.bin.part").exists()
    assert server.requests == [("/files/a.bin", None)]


def test_cut_transfer_is_resumed_from_the_cut_with_a_range_request(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(20_000)
    dest = tmp_path / "a.bin"
    download(f"{server.url}/cut-once/a.bin", dest, expected_sha256=sha256(data),
             backoff=TINY_BACKOFF, progress=False)
    assert dest.read_bytes() == data
    assert server.requests == [("/cut-once/a.bin", None),
                               ("/cut-once/a.bin", f"bytes={len(data) // 2}-")]


def test_tries_used_up_keep_the_part_and_a_rerun_resumes_it(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(16_000)
    dest = tmp_path / "a.bin"
    url = f"{server.url}/cut-always/a.bin"
    with pytest.raises(DownloadError) as info:
        download(url, dest, retries=2, backoff=TINY_BACKOFF, progress=False)
    part = tmp_path / "a.bin.part"
    kept = part.stat().st_size                          # half, then half of the rest, ...
    assert kept == 8000 + 4000 + 2000 and part.read_bytes() == data[:kept]
    message = str(info.value)
    assert message.startswith(url) and "\n" not in message and info.value.tries == 3
    assert "after 3 tries" in message and f"{part} ({kept} bytes) is kept" in message
    assert not dest.exists()
    server.requests.clear()
    download(f"{server.url}/files/a.bin", dest, progress=False)
    assert server.requests == [("/files/a.bin", f"bytes={kept}-")]
    assert dest.read_bytes() == data and not part.exists()


def test_wrong_checksum_removes_the_part_and_names_the_url(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(5000)
    dest, url = tmp_path / "a.bin", f"{server.url}/files/a.bin"
    with pytest.raises(ValueError) as info:
        download(url, dest, expected_sha256="0" * 64, progress=False)
    message = str(info.value)
    assert message == (f"{url}: downloaded 5000 bytes with sha256 {sha256(data)}, expected "
                       f"{'0' * 64} (damaged download or a changed file upstream); removed, "
                       f"rerun to download again")
    assert not dest.exists() and not (tmp_path / "a.bin.part").exists()


def test_wrong_size_is_refused(server, tmp_path):
    server.files["a.bin"] = random_bytes(5000)
    with pytest.raises(ValueError, match=r"downloaded 5000 bytes, expected 6000"):
        download(f"{server.url}/files/a.bin", tmp_path / "a.bin", expected_size=6000,
                 progress=False)
    assert list(tmp_path.iterdir()) == []


def test_refused_connection_is_retried_then_reported(tmp_path):
    with socket.socket() as probe:                      # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/a.bin"
    t0 = time.perf_counter()
    with pytest.raises(DownloadError) as info:
        download(url, tmp_path / "a.bin", retries=3, backoff=TINY_BACKOFF, progress=False)
    assert time.perf_counter() - t0 >= TINY_BACKOFF * (1 + 2 + 4)
    assert info.value.tries == 4 and info.value.reason == "Connection refused"
    assert isinstance(info.value, ConnectionError)
    assert str(info.value) == (f"{url}: cannot download (Connection refused) after 4 tries; "
                               f"no bytes were received, rerun to try again")
    assert list(tmp_path.iterdir()) == []


def test_server_error_is_retried_until_it_succeeds(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(3000)
    download(f"{server.url}/flaky/a.bin", tmp_path / "a.bin", backoff=TINY_BACKOFF,
             progress=False)
    assert (tmp_path / "a.bin").read_bytes() == data
    assert [path for path, _ in server.requests] == ["/flaky/a.bin"] * 3


def test_timeout_is_retried(server, tmp_path, capsys):
    data = server.files["a.bin"] = random_bytes(3000)
    url = f"{server.url}/stall-once/a.bin"
    download(url, tmp_path / "a.bin", timeout=0.2, backoff=TINY_BACKOFF, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == data and len(server.requests) == 2
    assert f"{url}: timed out; retry 1/4 in 0.0 s" in capsys.readouterr().err


def test_not_found_fails_at_once(server, tmp_path):
    url = f"{server.url}/files/nothing.bin"
    with pytest.raises(DownloadError) as info:
        download(url, tmp_path / "a.bin", retries=4, backoff=TINY_BACKOFF, progress=False)
    assert len(server.requests) == 1 and info.value.tries == 1
    assert str(info.value).startswith(f"{url}: cannot download (HTTP 404 Not Found)")


def test_complete_dest_is_not_downloaded_again(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(3000)
    dest = tmp_path / "a.bin"
    dest.write_bytes(data)
    url = f"{server.url}/files/a.bin"
    assert download(url, dest, expected_size=3000, expected_sha256=sha256(data)) == dest
    assert download(url, dest) == dest                  # nothing to check: present is enough
    assert server.requests == []
    dest.write_bytes(data[:100])                        # a damaged dest is fetched again
    download(url, dest, expected_size=3000, progress=False)
    assert dest.read_bytes() == data and len(server.requests) == 1


def test_server_ignoring_range_starts_over(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(4000)
    (tmp_path / "a.bin.part").write_bytes(b"x" * 1000)  # not a prefix of the file
    download(f"{server.url}/norange/a.bin", tmp_path / "a.bin", progress=False)
    assert server.requests == [("/norange/a.bin", "bytes=1000-")]
    assert (tmp_path / "a.bin").read_bytes() == data


def test_complete_part_answered_416_is_used_and_a_too_long_one_started_over(server, tmp_path):
    data = server.files["a.bin"] = random_bytes(4000)
    part, dest = tmp_path / "a.bin.part", tmp_path / "a.bin"
    part.write_bytes(data)
    download(f"{server.url}/files/a.bin", dest, expected_sha256=sha256(data), progress=False)
    assert dest.read_bytes() == data and server.requests == [("/files/a.bin", "bytes=4000-")]
    dest.unlink()
    server.requests.clear()
    part.write_bytes(data + b"extra")
    download(f"{server.url}/files/a.bin", dest, progress=False)
    assert dest.read_bytes() == data
    assert server.requests == [("/files/a.bin", "bytes=4005-"), ("/files/a.bin", None)]


def test_plain_progress_lines_have_no_carriage_return(server, tmp_path, capsys):
    server.files["a.bin"] = random_bytes(200_000)
    download(f"{server.url}/cut-once/a.bin", tmp_path / "a.bin", backoff=TINY_BACKOFF,
             progress=False)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and "a.bin: 0.2/0.2 MB (100%)" in err
    assert 5 <= len(lines) <= 2 * 10 + 1                # ~10 per try, and the retry note
    assert any("retry 1/4 in 0.0 s" in line for line in lines)


# ---------------------------------------------------------------- fetch_images
def coco_records(server, sizes):
    """COCO image records, one per (knob, width, height, actual width, actual height)."""
    records = []
    for image_id, (knob, width, height, actual_w, actual_h) in enumerate(sizes, 1):
        name = f"{image_id:012d}.jpg"
        server.files[name] = jpeg_bytes(actual_w, actual_h, seed=image_id)
        records.append({"id": image_id, "file_name": name, "width": width, "height": height,
                        "coco_url": f"{server.url}/{knob}/{name}"})
    return records


def test_fetch_images_reports_failures_by_id_and_a_rerun_fetches_only_those(server, tmp_path,
                                                                            capsys, monkeypatch):
    records = coco_records(server, [("files", 40, 30, 40, 30), ("cut-once", 32, 48, 32, 48),
                                    ("files", 24, 24, 24, 24), ("html", 40, 30, 40, 30),
                                    ("files", 50, 37, 64, 48), ("missing", 40, 30, 40, 30)])
    out = tmp_path / "images"
    result = fetch_images(records, out, workers=3, backoff=TINY_BACKOFF, progress=False,
                          allow_http=True)
    assert result["fetched"] == 3 and result["already_present"] == 0
    assert sorted(result["failed"]) == [4, 5, 6]
    assert result["failed"][4] == ("photo 4: not an image: the server sent text/html; refused "
                                   "(2 fetches)")
    assert result["failed"][5] == "photo 5: size 64x48, expected 50x37; refused (2 fetches)"
    assert result["failed"][6].startswith(f"{records[5]['coco_url']}: cannot download "
                                          f"(HTTP 404 Not Found)")
    for record in records[:3]:
        with Image.open(out / record["file_name"]) as image:
            image.load()
            assert image.size == (record["width"], record["height"])
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST] + [r["file_name"] for r in records[:3]])
    err = capsys.readouterr().err
    assert "\r" not in err and "fetch_images: 6/6 images (100%), 3 failed" in err

    server.requests.clear()
    opened, real_open = [], Image.open                  # the images the rerun decodes
    monkeypatch.setattr(photos_module.Image, "open",
                        lambda path: opened.append(path.name) or real_open(path))
    again = fetch_images(records, out, workers=3, backoff=TINY_BACKOFF, progress=False,
                         allow_http=True)
    assert again["fetched"] == 0 and again["already_present"] == 3
    assert sorted(opened) == sorted(2 * [r["file_name"] for r in records[3:5]])  # fetched twice
    assert again["failed"] == result["failed"]
    assert sorted(path for path, _ in server.requests) == sorted(r["coco_url"].removeprefix(
        server.url) for r in 2 * records[3:5] + records[5:])


def test_fetch_images_verifies_present_files_and_refetches_a_damaged_one(server, tmp_path):
    records = coco_records(server, [("files", 40, 30, 40, 30), ("files", 30, 20, 30, 20)])
    out = tmp_path / "images"
    fetch_images(records, out, backoff=TINY_BACKOFF, progress=False, allow_http=True)
    (out / MANIFEST).unlink()                           # no manifest: both are decoded again
    path = out / records[1]["file_name"]
    path.write_bytes(path.read_bytes()[:200])           # a truncated JPEG: fetched again
    server.requests.clear()
    result = fetch_images(records, out, backoff=TINY_BACKOFF, progress=False, allow_http=True)
    assert result == {"fetched": 1, "already_present": 1, "failed": {},
                      "redirected_to_http": 0}
    assert server.requests == [(f"/files/{records[1]['file_name']}", None)]
    assert path.read_bytes() == server.files[records[1]["file_name"]]
    lines = (out / MANIFEST).read_text().splitlines()
    assert sorted(lines) == sorted(f"{r['file_name']}\t{(out / r['file_name']).stat().st_size}"
                                   for r in records)


def test_fetch_images_runs_at_most_workers_downloads_at_once(server, tmp_path):
    records = coco_records(server, [("files", 16, 16, 16, 16)] * 9)
    server.delay = 0.1                                  # long enough for requests to overlap
    result = fetch_images(records, tmp_path, workers=3, progress=False, allow_http=True)
    assert result["fetched"] == 9 and len(server.requests) == 9
    assert 2 <= server.max_active <= 3


def test_a_photo_of_the_wrong_size_is_refused_before_decoding_and_fetched_once_more(server,
                                                                                    tmp_path):
    records = coco_records(server, [("other-once", 40, 30, 40, 30), ("files", 50, 37, 64, 48)])
    server.files[records[0]["file_name"] + ".other"] = jpeg_bytes(64, 48)   # first answer
    wrong = records[1]["file_name"]
    server.files[wrong] = server.files[wrong][:1700]   # header (64 x 48), half the scan
    result = fetch_images(records, tmp_path, backoff=TINY_BACKOFF, progress=False,
                          allow_http=True)
    assert result["fetched"] == 1 and (tmp_path / records[0]["file_name"]).read_bytes() == \
        server.files[records[0]["file_name"]]          # the second answer, 40 x 30
    # refused on its header's size (not as unreadable), twice, by id, and not kept
    assert result["failed"] == {2: "photo 2: size 64x48, expected 50x37; refused (2 fetches)"}
    assert [path for path, _ in server.requests].count(f"/files/{wrong}") == 2
    assert not (tmp_path / wrong).exists()


def png_header(width, height):
    """A PNG that says width x height and holds one empty zlib stream: header, no pixels."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_decompression_bomb_guard_stays_on(server, tmp_path):
    assert Image.MAX_IMAGE_PIXELS is not None           # importing minialign leaves it on
    side = 20_000                                       # 4e8 pixels > 2 * MAX_IMAGE_PIXELS
    server.files["bomb.png"] = png_header(side, side)
    record = {"id": 3, "file_name": "bomb.png", "width": side, "height": side,
              "coco_url": f"{server.url}/files/bomb.png"}  # the record agrees: Pillow refuses
    result = fetch_images([record], tmp_path, backoff=TINY_BACKOFF, progress=False,
                          allow_http=True)
    assert result["failed"][3].startswith("photo 3: not a readable image "
                                          "(DecompressionBombError: ")
    assert list(tmp_path.glob("*.png")) == []


def test_fetch_images_refuses_a_bad_record_by_id(tmp_path):
    good = {"id": 7, "file_name": "7.jpg", "coco_url": "http://x/7.jpg", "width": 1, "height": 1}
    with pytest.raises(ValueError, match=r"^image record 9: missing coco_url \("):
        fetch_images([good, {"id": 9, "file_name": "9.jpg", "width": 1, "height": 1}], tmp_path)
    with pytest.raises(ValueError, match=r"^image record 8: file_name '\.\./8\.jpg' is not"):
        fetch_images([dict(good, id=8, file_name="../8.jpg")], tmp_path)
    with pytest.raises(ValueError, match=r"^image record 8: file_name 7\.jpg is also that of "
                                         r"image record 7$"):
        fetch_images([good, dict(good, id=8)], tmp_path)
    with pytest.raises(ValueError, match=r"^image record #1: has no id"):
        fetch_images([good, {"file_name": "x.jpg"}], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_part_is_one_line_naming_it_and_not_retried(server, tmp_path):
    server.files["a.bin"] = random_bytes(3000)
    (tmp_path / "a.bin.part").mkdir()                   # open(part, "wb") fails on any system
    with pytest.raises(OSError, match=r"^\S+a\.bin\.part: cannot write \(Is a directory\); "):
        download(f"{server.url}/files/a.bin", tmp_path / "a.bin", progress=False)
    assert len(server.requests) == 1


def test_progress_bars_on_request(server, tmp_path, capsys):
    data = server.files["a.bin"] = random_bytes(100_000)
    download(f"{server.url}/cut-once/a.bin", tmp_path / "a.bin", backoff=TINY_BACKOFF,
             progress=True)                             # the bar is reset for the resumed try
    records = coco_records(server, [("files", 20, 10, 20, 10), ("missing", 20, 10, 20, 10)])
    result = fetch_images(records, tmp_path / "images", backoff=TINY_BACKOFF, progress=True,
                          allow_http=True)
    assert (tmp_path / "a.bin").read_bytes() == data and result["fetched"] == 1
    err = capsys.readouterr().err
    assert "a.bin: 100%" in err and "fetch_images: 100%" in err and "1 failed" in err


# ---------------------------------------------------------------- HTTPS only, unless allowed
def test_photo_urls_are_https_unless_http_is_allowed():
    coco = "http://images.cocodataset.org/train2017/000000000009.jpg"
    assert IMAGES_URL == "https://images.cocodataset.org/"
    assert photo_url(coco) == "https://images.cocodataset.org/train2017/000000000009.jpg"
    for spelling in ("https://s3.amazonaws.com/images.cocodataset.org/",
                     "https://s3.amazonaws.com/images.cocodataset.org"):    # either, one "/"
        assert photo_url(coco, spelling) == \
            "https://s3.amazonaws.com/images.cocodataset.org/train2017/000000000009.jpg"
    assert photo_url("http://127.0.0.1:8/files/a.jpg") == "https://127.0.0.1:8/files/a.jpg"
    assert photo_url("http://127.0.0.1:8/files/a.jpg", allow_http=True) == \
        "http://127.0.0.1:8/files/a.jpg"
    refuse_http("--images-url", "https://x/", allow_http=False)          # fine
    refuse_http("--images-url", "http://x/", allow_http=True)            # allowed
    with pytest.raises(ValueError, match=r"^--images-url http://x/: plain HTTP refused "):
        refuse_http("--images-url", "http://x/", allow_http=False)


def test_https_download_verifies_the_server_certificate(tls_server, tls_cert, tmp_path,
                                                        monkeypatch):
    """Over TLS with a self-signed certificate: refused at once (no retries) while it is not
    trusted; trusted through SSL_CERT_FILE, downloaded and resumed after a cut."""
    data = tls_server.files["a.bin"] = random_bytes(20_000)
    url = f"{tls_server.url}/cut-once/a.bin"
    with pytest.raises(DownloadError) as info:
        download(url, tmp_path / "a.bin", backoff=TINY_BACKOFF, progress=False)
    assert info.value.tries == 1 and "TLS certificate does not verify" in str(info.value)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    download(url, tmp_path / "a.bin", expected_sha256=sha256(data), backoff=TINY_BACKOFF,
             progress=False)
    assert (tmp_path / "a.bin").read_bytes() == data
    assert [r for _, r in tls_server.requests] == [None, f"bytes={len(data) // 2}-"]


# ---------------------------------------------------------------- every hop HTTPS
def test_a_redirect_from_https_to_http_is_refused_before_any_byte(tls_server, server, tmp_path,
                                                                  monkeypatch, capsys):
    """302 to http:// from an https:// URL: one line naming both URLs and --allow-http, not
    retried, the http:// server never asked, nothing written; with allow_http followed and
    said on stderr."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))
    data = server.files["a.bin"] = random_bytes(3000)
    url, target = f"{tls_server.url}/moved/a.bin", f"{server.url}/files/a.bin"
    tls_server.redirects["/moved/a.bin"] = target
    with pytest.raises(DownloadError) as info:
        download(url, tmp_path / "a.bin", backoff=TINY_BACKOFF, progress=False)
    assert str(info.value) == (f"{url}: redirected (302) to {target}: plain HTTP refused "
                               f"(unauthenticated: the bytes can be changed on the way); pass "
                               f"--allow-http to follow it")
    assert info.value.tries == 1 and len(tls_server.requests) == 1 and server.requests == []
    assert list(tmp_path.iterdir()) == []
    download(url, tmp_path / "a.bin", expected_sha256=sha256(data), progress=False,
             allow_http=True)
    assert (tmp_path / "a.bin").read_bytes() == data and server.requests == [("/files/a.bin",
                                                                              None)]
    assert (f"{url}: redirected (302) to {target}, plain HTTP, followed (--allow-http)"
            in capsys.readouterr().err)


def test_a_redirect_from_https_to_https_is_followed(tls_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))
    data = tls_server.files["a.bin"] = random_bytes(3000)
    tls_server.redirects["/moved/a.bin"] = f"{tls_server.url}/files/a.bin"
    download(f"{tls_server.url}/moved/a.bin", tmp_path / "a.bin", expected_sha256=sha256(data),
             progress=False)
    assert (tmp_path / "a.bin").read_bytes() == data
    assert [p for p, _ in tls_server.requests] == ["/moved/a.bin", "/files/a.bin"]
    assert "redirected" not in capsys.readouterr().err
