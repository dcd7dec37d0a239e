"""Tests of coco.py: the subset every step shares, the annotations download and extraction,
and `python -m minialign data` end to end: on a zip built here with the download replaced by a
copy of a local file, and over HTTP against the local server of tests/localhttp.py.
"""
import hashlib
import io
import json
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from minialign.machinery.images import coco, export
from minialign.__main__ import main
from minialign.data import split_photos
from minialign.machinery.run.monitor import load_coco_captions

WORDS = np.array([f"word{i}" for i in range(400)])  # made-up vocabulary
N_PHOTOS, N_FEW = 30_000, 100                        # photos with 5-7 captions; with 4


def made_up_coco(n_photos, seed=0, n_few=0):
    """A COCO-format captions dict: n_photos photos of 5-7 captions of 8 random words, and
    n_few photos of only 4 captions (not eligible for a subset); ids random, not ordered."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(1, 10 * (n_photos + n_few)), n_photos + n_few, replace=False)
    counts = np.concatenate([rng.integers(5, 8, n_photos), np.full(n_few, 4)])     # (P,)
    words = WORDS[rng.integers(0, len(WORDS), (int(counts.sum()), 8))].tolist()
    owner = np.repeat(ids, counts).tolist()
    images = [{"license": 1, "file_name": f"{i:012d}.jpg", "coco_url":
               f"http://images.cocodataset.org/train2017/{i:012d}.jpg", "height": 480,
               "width": 640, "date_captured": "2013-11-14 11:18:45", "id": int(i)}
              for i in ids.tolist()]
    annotations = [{"image_id": owner[k], "id": 10 * k + 1, "caption": " ".join(words[k])}
                   for k in rng.permutation(len(owner)).tolist()]
    return {"info": {"description": "made up", "year": 2017}, "licenses": [{"id": 1}],
            "images": images, "annotations": annotations}


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 30,100-photo captions file and its 10,000-photo subsets with seeds 0 (twice) and 1."""
    root = tmp_path_factory.mktemp("big")
    source = root / "captions_train2017.json"
    source.write_text(json.dumps(made_up_coco(N_PHOTOS, n_few=N_FEW)))
    return {"source": source, **{name: coco.write_subset(source, root / f"{name}.json", 10000, s)
                                 for name, s in (("a", 0), ("b", 0), ("other", 1))}}


def test_subset_is_seeded_byte_identical_and_complete(big):
    a, other = json.loads(big["a"].read_text()), json.loads(big["other"].read_text())
    assert big["a"].read_bytes() == big["b"].read_bytes()
    ids = [img["id"] for img in a["images"]]
    assert len(ids) == 10000 and ids == sorted(ids)
    assert set(ids) != {img["id"] for img in other["images"]}
    source = json.loads(big["source"].read_text())
    few = {i for i, n in zip(*np.unique([x["image_id"] for x in source["annotations"]],
                                        return_counts=True)) if n == 4}
    assert len(few) == N_FEW and not few & set(ids)          # 4 captions: never chosen
    chosen = set(ids)
    want = [x for x in source["annotations"] if x["image_id"] in chosen]
    assert a["annotations"] == want                           # all theirs, in file order
    assert a["images"][0] == next(x for x in source["images"] if x["id"] == ids[0])
    assert list(a) == ["info", "licenses", "images", "annotations"]
    info = a["info"]["minialign_subset"]
    assert {k: info[k] for k in ("num_photos", "seed", "eligible_photos", "format")} == {
        "num_photos": 10000, "seed": 0, "eligible_photos": N_PHOTOS, "format": 1}
    assert info["source_file"] == "captions_train2017.json"
    assert info["source_sha256"] == hashlib.sha256(big["source"].read_bytes()).hexdigest()
    assert a["info"]["description"] == "made up"
    assert coco.read_subset_info(big["a"]) == info and coco.read_subset_info(big["source"]) is None


def test_every_step_sees_the_subset_photos_split_8000_1000_1000(big):
    subset = json.loads(big["a"].read_text())
    photos = [(img["id"], img["file_name"]) for img in subset["images"]]
    assert export.choose_photos(export.read_captioned_photos(big["a"]), None, 0) == photos
    captions = load_coco_captions(big["a"])
    assert captions.image_ids.tolist() == [i for i, _ in photos]
    sizes = {name: len(idx) for name, idx in split_photos(captions.image_ids).items()}
    assert sizes == {"train": 8000, "val": 1000, "test": 1000}


def test_more_photos_than_eligible_is_one_line(tmp_path):
    source = tmp_path / "c.json"
    source.write_text(json.dumps(made_up_coco(20, n_few=3)))
    with pytest.raises(ValueError) as err:
        coco.write_subset(source, tmp_path / "s.json", num_photos=21)
    assert str(err.value) == (f"{source}: cannot choose 21 photos, only 20 of its 23 photos "
                              f"have >= 5 captions; pass --num-photos 20 or fewer")
    assert not (tmp_path / "s.json").exists()


# ---------------------------------------------------------------- the annotations zip
@pytest.fixture
def fake_download(monkeypatch):
    """minialign.download with download() copying a local file (url = its path) and
    fetch_images() recording its records; returns the list of calls."""
    from minialign.machinery.images import download, photos
    calls = []

    def fake(url, dest, expected_size=None, expected_sha256=None, retries=4, backoff=1.0,
             timeout=60, progress=None, allow_http=False):
        calls.append(("download", url, dest))
        shutil.copyfile(url, dest)
        return Path(dest)

    def fetch(records, out_dir, **kwargs):
        calls.append(("fetch", records, out_dir))
        return {"fetched": len(records), "already_present": 0, "failed": {}}
    monkeypatch.setattr(download, "download", fake)
    monkeypatch.setattr(photos, "fetch_images", fetch)
    return calls


@pytest.fixture
def zip_of(tmp_path_factory):
    """A small annotations_trainval2017.zip (stored, not deflated) with both captions files
    and a member that is not extracted. Returns (zip path, {name: bytes}, {"zip_size",
    "zip_sha256"}: its own published values, for get_annotations)."""
    folder = tmp_path_factory.mktemp("zip")
    files = {"captions_train2017.json": json.dumps(made_up_coco(40, seed=1)).encode(),
             "captions_val2017.json": json.dumps(made_up_coco(15, seed=2)).encode()}
    path = folder / coco.ANNOTATIONS_ZIP
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in files.items():
            zf.writestr(f"annotations/{name}", data)
        zf.writestr("annotations/instances_val2017.json", b"{}")
    return path, files, {"zip_size": path.stat().st_size,
                         "zip_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def publish(monkeypatch, digest):
    """Make a test zip's size and sha256 the published ones, as the command reads them; BERT's
    vocabulary a file written in place (no network: tests/test_wordpiece.py fetches it)."""
    from minialign.machinery.images import bert_vocab
    monkeypatch.setattr(coco, "ANNOTATIONS_SIZE", digest["zip_size"])
    monkeypatch.setattr(coco, "ANNOTATIONS_SHA256", digest["zip_sha256"])

    def get_vocab(root, url, allow_http):
        (Path(root) / bert_vocab.VOCAB_NAME).write_text("[PAD]\n")
        return Path(root) / bert_vocab.VOCAB_NAME
    monkeypatch.setattr(bert_vocab, "get_vocab", get_vocab)


def test_annotations_extracted_verified_then_skipped(tmp_path, zip_of, fake_download, capsys):
    url, files, sha = zip_of
    paths = coco.get_annotations(tmp_path, url=url, **sha)
    assert {k: p.read_bytes() for k, p in paths.items()} == {
        "train": files["captions_train2017.json"], "val": files["captions_val2017.json"]}
    assert sorted(p.name for p in (tmp_path / "annotations").iterdir()) == [
        "MANIFEST.sha256", "captions_train2017.json", "captions_val2017.json"]
    assert (tmp_path / "annotations" / "MANIFEST.sha256").read_text() == "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in files.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["annotations"]   # zip deleted
    assert f"extracted from {tmp_path / coco.ANNOTATIONS_ZIP} (sha256 " in capsys.readouterr().out
    assert coco.get_annotations(tmp_path, url="nowhere", **sha) == paths
    assert len(fake_download) == 1 and "complete (MANIFEST.sha256 matches), skipped" in \
        capsys.readouterr().out


@pytest.mark.parametrize("damage, said", [
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + b" "), "captions_train2017.json damaged"),
    (lambda p: p.unlink(), "captions_train2017.json missing"),
    (lambda p: (p.parent / "MANIFEST.sha256").unlink(), "no MANIFEST.sha256")])  # by hand
def test_damaged_or_missing_file_is_named_and_extracted_again(tmp_path, zip_of, fake_download,
                                                              capsys, damage, said):
    url, files, sha = zip_of
    paths = coco.get_annotations(tmp_path, url=url, **sha)
    (tmp_path / "annotations" / "notes.txt").write_text("mine")           # kept
    damage(paths["train"])
    coco.get_annotations(tmp_path, url=url, **sha)
    assert said in capsys.readouterr().out and len(fake_download) == 2
    assert paths["train"].read_bytes() == files["captions_train2017.json"]
    assert (tmp_path / "annotations" / "notes.txt").read_text() == "mine"
    assert coco.manifest_problems(tmp_path / "annotations") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["annotations"]


def truncated(path, folder):
    """The first half of the zip (a cut that was not resumed)."""
    (folder / path.name).write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    return folder / path.name


def one_byte_changed(path, folder):
    """One byte changed inside the stored captions_train2017.json: same size, other sha256."""
    data = path.read_bytes()
    at = data.index(b'"made up"')
    (folder / path.name).write_bytes(data[:at] + b'"made uP"' + data[at + 9:])
    return folder / path.name


@pytest.mark.parametrize("make_bad", [truncated, one_byte_changed])
def test_a_zip_unlike_the_published_one_is_refused_before_extraction(
        tmp_path, zip_of, fake_download, monkeypatch, make_bad):
    url, _, digest = zip_of
    bad = make_bad(url, tmp_path)
    extracted = []
    monkeypatch.setattr(coco, "extract_captions", lambda *args: extracted.append(args))
    with pytest.raises(ValueError) as err:
        coco.get_annotations(tmp_path / "coco", url=bad, **digest)
    zip_path, found = tmp_path / "coco" / coco.ANNOTATIONS_ZIP, hashlib.sha256(bad.read_bytes())
    size, expected = digest["zip_size"], digest["zip_sha256"]
    what = (f"sha256 {found.hexdigest()}" if make_bad is one_byte_changed
            else f"{size // 2} bytes")
    assert str(err.value) == (f"{zip_path}: {what}, expected {size} bytes with sha256 "
                              f"{expected} (COCO's published {coco.ANNOTATIONS_ZIP}); a damaged "
                              f"download or another file at --annotations-url; deleted it, "
                              f"nothing extracted (rerun to download it again)")
    assert extracted == [] and sorted((tmp_path / "coco").iterdir()) == []   # nothing kept


def test_the_published_zip_is_the_default(tmp_path, zip_of, fake_download):
    url, _, _ = zip_of
    assert (coco.ANNOTATIONS_SIZE, coco.ANNOTATIONS_SHA256) == (
        252_907_541, "113a836d90195ee1f884e704da6304dfaaecff1f023f49b6ca93c4aaae470268")
    assert coco.ANNOTATIONS_URL.startswith("https://")
    with pytest.raises(ValueError, match=r"expected 252907541 bytes with sha256 113a836d"):
        coco.get_annotations(tmp_path, url=url)                 # our small zip: refused
    assert sorted(tmp_path.iterdir()) == []


def test_failure_during_extraction_never_leaves_a_half_folder(tmp_path, zip_of, fake_download,
                                                              monkeypatch):
    url, _, sha = zip_of

    def interrupted(folder, names):                   # both files are out, manifest is not
        assert len(list(Path(folder).iterdir())) == 2
        raise KeyboardInterrupt
    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(coco, "write_manifest", interrupted)
        coco.get_annotations(tmp_path, url=url, **sha)
    assert [p.name for p in tmp_path.iterdir()] == [coco.ANNOTATIONS_ZIP]   # kept for a rerun
    (tmp_path / ".annotations.tmp-killed").mkdir()    # what a SIGKILL would leave
    (tmp_path / ".annotations.tmp-killed" / "captions_train2017.json").write_text("{")
    coco.get_annotations(tmp_path, url=url, **sha)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["annotations"]
    assert coco.manifest_problems(tmp_path / "annotations") == []


# ---------------------------------------------------------------- the command
def test_data_command_end_to_end(tmp_path, zip_of, fake_download, monkeypatch, capsys):
    url, files, sha = zip_of
    publish(monkeypatch, sha)
    root = tmp_path / "coco"
    argv = ["data", "--root", str(root), "--num-photos", "12", "--seed", "3",
            "--annotations-url", str(url)]
    assert main(argv + ["--no-images"]) == 0
    subset = root / "captions_train2017_subset12_seed3.json"
    first = subset.read_bytes()
    out = capsys.readouterr().out
    assert f"{subset}: wrote 12 of 40 eligible photos (seed 3)" in out and "next: `make" in out
    assert main(argv) == 0                                      # again, now with the images
    out = capsys.readouterr().out
    assert "complete (MANIFEST.sha256 matches), skipped" in out
    assert f"{subset}: subset complete (12 photos, seed 3), skipped" in out
    assert "next: `make embeddings`" in out and subset.read_bytes() == first
    (_, records, out_dir), = [c for c in fake_download if c[0] == "fetch"]
    assert records == json.loads(first)["images"] and out_dir == root / "train2017"
    assert len([c for c in fake_download if c[0] == "download"]) == 1

    shutil.copyfile(coco.write_subset(root / "annotations" / "captions_train2017.json",
                                      tmp_path / "seed4.json", 12, 4), subset)
    assert main(argv + ["--no-images"]) == 2                    # another subset: refused
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"minialign data: error: {subset}: holds another subset")
    assert err.endswith("pass --force to replace it") and "\n" not in err
    assert main(argv + ["--no-images", "--force"]) == 0 and subset.read_bytes() == first


def test_photos_that_fail_to_download_are_one_line_exit_2(tmp_path, zip_of, fake_download,
                                                          monkeypatch, capsys):
    url, _, sha = zip_of
    publish(monkeypatch, sha)
    failing = {"fetched": 10, "already_present": 0, "failed": {42: "HTTP 404", 7: "timed out"}}
    monkeypatch.setattr(sys.modules["minialign.machinery.images.photos"], "fetch_images",
                        lambda records, out_dir, **kw: failing)
    assert main(["data", "--root", str(tmp_path), "--num-photos", "12",
                 "--annotations-url", str(url)]) == 2
    assert capsys.readouterr().err == (
        "minialign data: error: 2 photos could not be fetched: ids [7, 42] (HTTP 404; "
        "timed out); rerun `make data` to retry\n")


# ---------------------------------------------------------------- over HTTP(S), end to end
def serve_coco(server, tmp_path, monkeypatch, broken_knob="html", on_coco_host=False):
    """Serve a 30-photo annotations zip (published here: its size and sha256 patched in) and
    small photos of the recorded sizes, each coco_url http:// on the server's port, as COCO's
    are; one photo of the 10-photo subset answers with broken_knob. Returns its id.
    on_coco_host: each coco_url is COCO's own (http://images.cocodataset.org/train2017/NAME),
    served as /files/train2017/NAME (so --images-url SERVER/files fetches them)."""
    from localhttp import jpeg_bytes
    source = made_up_coco(30, seed=5)
    broken_id = coco.choose_subset(source, 10, 0)["images"][3]["id"]
    port = server.url.rpartition(":")[2]
    for image in source["images"]:
        knob = broken_knob if image["id"] == broken_id else "files"
        name = image["file_name"]
        image.update(width=32, height=24,
                     coco_url=f"http://127.0.0.1:{port}/{knob}/{name}")
        if on_coco_host:
            image["coco_url"], name = f"http://images.cocodataset.org/train2017/{name}", \
                f"train2017/{name}"
        server.files[name] = jpeg_bytes(32, 24, seed=image["id"])
    archive = tmp_path / "served.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(coco.TRAIN_CAPTIONS, json.dumps(source))
        zf.writestr(coco.VAL_CAPTIONS, json.dumps(made_up_coco(8, seed=6)))
    server.files[coco.ANNOTATIONS_ZIP] = archive.read_bytes()
    publish(monkeypatch, {"zip_size": archive.stat().st_size,
                          "zip_sha256": hashlib.sha256(archive.read_bytes()).hexdigest()})
    return broken_id


def test_plain_http_is_refused_without_the_flag(tmp_path, server, capsys):
    root = tmp_path / "coco"
    zip_url = f"{server.url}/files/{coco.ANNOTATIONS_ZIP}"
    for flag, url in (("--annotations-url", zip_url), ("--images-url", f"{server.url}/")):
        assert main(["data", "--root", str(root), flag, url]) == 2
        assert capsys.readouterr().err == (
            f"minialign data: error: {flag} {url}: plain HTTP refused (unauthenticated: the "
            f"bytes can be changed on the way); use an https:// URL, or pass --allow-http\n")
    assert not root.exists() and server.requests == []      # refused before anything


def test_data_over_http_then_a_rerun_fetches_only_what_failed(tmp_path, server, monkeypatch,
                                                              capsys):
    """`data --allow-http` against a local server: the annotations zip cut mid-transfer once
    (resumed), checked, the subset's photos fetched in parallel, one photo an HTML error page
    (fetched twice, reported by id, exit 2); the rerun downloads nothing but that photo."""
    broken_id = serve_coco(server, tmp_path, monkeypatch)
    root = tmp_path / "coco"
    server.delay = 0.05                      # each answer waits, so parallel requests overlap
    argv = ["data", "--root", str(root), "--num-photos", "10", "--workers", "3",
            "--annotations-url", f"{server.url}/cut-once/{coco.ANNOTATIONS_ZIP}", "--allow-http"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("--allow-http: plain http:// URLs are used "
                                                   "as given, and redirects to them followed "
                                                   "(the zip is still checked")
    err = captured.err.strip().splitlines()
    assert "transfer cut short" in err[1] and "\r" not in "".join(err)
    assert err[-1] == (f"minialign data: error: 1 photos could not be fetched: ids [{broken_id}] "
                       f"(photo {broken_id}: not an image: the server sent text/html; refused "
                       f"(2 fetches)); rerun `make data` to retry")
    zip_requests = [r for r in server.requests if r[0].endswith(coco.ANNOTATIONS_ZIP)]
    assert len(zip_requests) == 2 and zip_requests[1][1].startswith("bytes=")   # resumed
    assert not (root / coco.ANNOTATIONS_ZIP).exists()           # deleted once extracted
    fetched = sorted(p.name for p in (root / "train2017").glob("*.jpg"))
    assert len(fetched) == 9 and f"{broken_id:012d}.jpg" not in fetched
    assert 2 <= server.max_active <= 3
    subset = json.loads((root / "captions_train2017_subset10_seed0.json").read_text())
    assert sorted(i["file_name"] for i in subset["images"]) == sorted(fetched + [
        f"{broken_id:012d}.jpg"])

    server.requests.clear()
    assert main(argv) == 2                   # the rerun: only the failed photo is asked for
    assert server.requests == 2 * [(f"/html/{broken_id:012d}.jpg", None)]
    assert f"ids [{broken_id}]" in capsys.readouterr().err


def test_data_over_https_rewrites_the_photos_http_urls(tmp_path, tls_server, tls_cert,
                                                       monkeypatch, capsys):
    """Without --allow-http: the zip over HTTPS, and each photo's http:// coco_url fetched as
    https:// from the same server, whose certificate the client trusts (SSL_CERT_FILE)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    serve_coco(tls_server, tmp_path, monkeypatch, broken_knob="files")
    root = tmp_path / "coco"
    assert main(["data", "--root", str(root), "--num-photos", "10", "--annotations-url",
                 f"{tls_server.url}/files/{coco.ANNOTATIONS_ZIP}"]) == 0
    assert "10 photos fetched, 0 already present" in capsys.readouterr().out
    assert len(list((root / "train2017").glob("*.jpg"))) == 10
    assert len(tls_server.requests) == 11                        # the zip and 10 photos


def test_a_redirect_to_http_is_refused_unless_allowed(tmp_path, tls_server, server, monkeypatch,
                                                      capsys):
    """The zip's https:// URL answers 302 Location: http://...: one line naming both URLs and
    --allow-http, exit 2, no zip or .part kept, the http:// server never asked; with
    --allow-http the redirect is followed and said."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))
    serve_coco(tls_server, tmp_path, monkeypatch, broken_knob="files")
    server.files[coco.ANNOTATIONS_ZIP] = tls_server.files[coco.ANNOTATIONS_ZIP]
    url = f"{tls_server.url}/moved/{coco.ANNOTATIONS_ZIP}"
    target = f"{server.url}/files/{coco.ANNOTATIONS_ZIP}"
    tls_server.redirects[f"/moved/{coco.ANNOTATIONS_ZIP}"] = target
    root = tmp_path / "coco"
    argv = ["data", "--root", str(root), "--num-photos", "10", "--no-images",
            "--annotations-url", url]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"minialign data: error: {url}: redirected (302) to {target}: plain HTTP refused "
        f"(unauthenticated: the bytes can be changed on the way); pass --allow-http to follow "
        f"it\n")
    assert server.requests == [] and sorted(p.name for p in root.iterdir()) == [".lock"]
    assert main(argv + ["--allow-http"]) == 0
    assert (f"{url}: redirected (302) to {target}, plain HTTP, followed (--allow-http)"
            in capsys.readouterr().err)
    assert server.requests == [(f"/files/{coco.ANNOTATIONS_ZIP}", None)]
    assert not coco.manifest_problems(root / "annotations")


def test_a_photo_redirected_to_http_is_refused_unless_allowed(tmp_path, tls_server, server,
                                                              monkeypatch, capsys):
    """COCO-host photos fetched from --images-url (written without its trailing "/"): one of
    them answers 302 Location: http://...: refused by id in one line, exit 2, the photo not
    kept; with --allow-http followed, and the count said."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))
    serve_coco(tls_server, tmp_path, monkeypatch, on_coco_host=True)
    subset = coco.choose_subset(json.loads(zipfile.ZipFile(io.BytesIO(tls_server.files[
        coco.ANNOTATIONS_ZIP])).read(coco.TRAIN_CAPTIONS)), 10, 0)
    moved = subset["images"][5]
    name = f"train2017/{moved['file_name']}"
    server.files[name] = tls_server.files[name]
    url, target = f"{tls_server.url}/files/{name}", f"{server.url}/files/{name}"
    tls_server.redirects[f"/files/{name}"] = target
    root = tmp_path / "coco"
    argv = ["data", "--root", str(root), "--num-photos", "10", "--images-url",
            f"{tls_server.url}/files", "--annotations-url",
            f"{tls_server.url}/files/{coco.ANNOTATIONS_ZIP}"]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"minialign data: error: 1 photos could not be fetched: ids [{moved['id']}] ({url}: "
        f"redirected (302) to {target}: plain HTTP refused (unauthenticated: the bytes can be "
        f"changed on the way); pass --allow-http to follow it); rerun `make data` to retry")
    photos = sorted(p.name for p in (root / "train2017").iterdir() if p.suffix != ".tsv")
    assert len(photos) == 9 and moved["file_name"] not in photos and server.requests == []
    assert main(argv + ["--allow-http"]) == 0
    assert ("1 photos fetched, 9 already present (1 through a redirect to plain http://, "
            "followed: --allow-http)") in capsys.readouterr().out
    assert (root / "train2017" / moved["file_name"]).read_bytes() == server.files[name]
