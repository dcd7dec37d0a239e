"""coco.py against a local HTTPS server (tests/localhttp.py, a self-signed certificate the client
is told to trust): downloads checked by sha256, resumed after a cut, refused over plain HTTP at
any hop; the subset on a made-up captions file; `data` end to end, interrupted and rerun."""
import hashlib
import io
import json
import zipfile

import numpy as np
import pytest
from PIL import Image

from minialign.data import load_captions, split_photos
from minialign.machinery import coco
from minialign.machinery.coco import download

FAST = {"backoff": 0.01}                        # retries wait 0.01, 0.02, ... s


@pytest.fixture
def https(tls_server, tls_cert, monkeypatch):
    """conftest's HTTPS server, its certificate trusted by urllib (SSL_CERT_FILE)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    return tls_server


def data(n, seed=0):
    return np.random.default_rng(seed).bytes(n)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def jpeg(width, height, seed=0):
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_download_checks_sha256_and_resumes_a_cut_with_a_range_request(https, tmp_path):
    body = https.files["a.bin"] = data(20_000)
    dest = tmp_path / "sub" / "a.bin"
    assert download(f"{https.url}/cut-once/a.bin", dest, sha256=sha(body), **FAST) == dest
    assert dest.read_bytes() == body and not (tmp_path / "sub" / "a.bin.part").exists()
    assert https.requests == [("/cut-once/a.bin", None), ("/cut-once/a.bin", "bytes=10000-")]
    assert download(f"{https.url}/files/a.bin", dest, sha256=sha(body)) == dest
    assert len(https.requests) == 2                       # a checked copy: no request
    url, other = f"{https.url}/files/a.bin", tmp_path / "other"
    with pytest.raises(ValueError) as err:                # a wrong sha256: nothing kept
        download(url, other / "a.bin", sha256="0" * 64)
    assert str(err.value) == (f"{url}: downloaded 20000 bytes with sha256 {sha(body)}, expected "
                              f"{'0' * 64} (a damaged download or another file); deleted, rerun "
                              f"to download again")
    assert list(other.iterdir()) == []


def test_tries_used_up_keep_the_part_and_a_rerun_resumes_it(https, tmp_path):
    body = https.files["a.bin"] = data(16_000)
    url, dest = f"{https.url}/cut-always/a.bin", tmp_path / "a.bin"
    with pytest.raises(ConnectionError) as err:
        download(url, dest, retries=2, **FAST)
    kept = 8000 + 4000 + 2000                             # half, then half the rest, ...
    part = tmp_path / "a.bin.part"
    assert part.read_bytes() == body[:kept] and not dest.exists()
    assert str(err.value) == (f"{url}: cannot download (transfer cut short at {kept} of 16000 "
                              f"bytes) after 3 tries; {kept} bytes kept in {part}, rerun to resume")
    https.requests.clear()
    download(f"{https.url}/files/a.bin", dest, sha256=sha(body))
    assert https.requests == [("/files/a.bin", f"bytes={kept}-")] and dest.read_bytes() == body
    part.write_bytes(body)                                # whole, but not yet renamed: 416
    dest.unlink()
    download(f"{https.url}/files/a.bin", dest, sha256=sha(body))
    assert dest.read_bytes() == body and not part.exists()


def test_server_errors_are_retried_and_a_404_is_not(https, tmp_path, capsys):
    body = https.files["a.bin"] = data(3000)
    download(f"{https.url}/flaky/a.bin", tmp_path / "a.bin", **FAST)
    assert (tmp_path / "a.bin").read_bytes() == body and len(https.requests) == 3
    assert "HTTP 500 Internal Server Error; retry 2/4 in 0.0 s" in capsys.readouterr().err
    with pytest.raises(ConnectionError, match=r"/files/none: HTTP 404 Not Found; check the URL$"):
        download(f"{https.url}/files/none", tmp_path / "b.bin", **FAST)
    assert len(https.requests) == 4 and not (tmp_path / "b.bin.part").exists()


def test_an_untrusted_certificate_fails_at_once(tls_server, tmp_path):
    tls_server.files["a.bin"] = data(100)                 # SSL_CERT_FILE not set
    with pytest.raises(ConnectionError, match="TLS certificate does not verify"):
        download(f"{tls_server.url}/files/a.bin", tmp_path / "a.bin", **FAST)
    assert list(tmp_path.iterdir()) == [] and len(tls_server.requests) == 0


def test_plain_http_is_refused_at_every_hop_before_writing_anything(https, server, tmp_path):
    target = f"{server.url}/files/a.bin"
    with pytest.raises(ValueError, match=r"^http://\S+: plain HTTP refused .* https:// URL$"):
        download(target, tmp_path / "a.bin")
    for flag in ("annotations_url", "images_url", "vocab_url"):
        with pytest.raises(ValueError, match=r"^--[a-z]+-url http://x/: plain HTTP refused"):
            coco.run_data(tmp_path / "coco", **{flag: "http://x/"})
    url = f"{https.url}/moved/a.bin"
    https.redirects["/moved/a.bin"] = target
    with pytest.raises(ValueError) as err:
        download(url, tmp_path / "a.bin", **FAST)
    assert str(err.value) == (f"{url}: redirected (302) to {target}: plain HTTP refused "
                              f"(unauthenticated: the bytes can be changed on the way)")
    assert len(https.requests) == 1                      # refused, not retried
    assert server.requests == [] and list(tmp_path.iterdir()) == []
    body = https.files["b.bin"] = data(3000)             # https -> https: followed
    https.redirects["/moved/b.bin"] = f"{https.url}/files/b.bin"
    download(f"{https.url}/moved/b.bin", tmp_path / "b.bin", sha256=sha(body))
    assert (tmp_path / "b.bin").read_bytes() == body


def made_up_coco(n_photos, seed=0, n_few=0, n_same=0):
    """COCO captions: n_photos photos with 5-7 captions of random words, n_few with 4, n_same
    with 5 captions that clean to one; ids shuffled, annotations in random order."""
    rng = np.random.default_rng(seed)
    n = n_photos + n_few + n_same
    ids = rng.choice(np.arange(1, 10 * n), n, replace=False)
    counts = np.concatenate([rng.integers(5, 8, n_photos), np.full(n_few, 4), np.full(n_same, 5)])
    words = rng.integers(0, 400, (int(counts.sum()), 6))
    captions = [" ".join(f"w{i}" for i in row) for row in words]
    owner = np.repeat(ids, counts).tolist()
    for k in range(len(owner) - 5 * n_same, len(owner)):
        captions[k] = ["A dog.", "a  dog.", "A DOG.", " a dog.", "a dog."][k % 5]
    images = [{"license": 1, "file_name": f"{i:012d}.jpg", "height": 24, "width": 32, "id": i,
               "coco_url": f"http://images.cocodataset.org/train2017/{i:012d}.jpg"}
              for i in ids.tolist()]
    annotations = [{"image_id": owner[k], "id": 10 * k + 1, "caption": captions[k]}
                   for k in rng.permutation(len(owner)).tolist()]
    return {"info": {"description": "made up"}, "licenses": [{"id": 1}], "images": images,
            "annotations": annotations}


def test_the_subset_is_seeded_eligible_and_kept_whole_by_the_loader(tmp_path):
    source = tmp_path / "captions_train2017.json"
    made = made_up_coco(1030, n_few=20, n_same=20)
    source.write_text(json.dumps(made))
    subset, other = coco.choose_subset(source, 1000, 0), coco.choose_subset(source, 1000, 1)
    assert coco.choose_subset(source, 1000, 0) == subset
    ids = [image["id"] for image in subset["images"]]
    assert len(ids) == 1000 and ids == sorted(ids)
    assert ids != [image["id"] for image in other["images"]]
    ineligible = {image["id"] for image in made["images"][-40:]}     # 4 captions, or one
    assert not ineligible & set(ids)
    chosen = set(ids)
    assert subset["annotations"] == [x for x in made["annotations"] if x["image_id"] in chosen]
    info = subset["info"]["minialign_subset"]
    assert (info["num_photos"], info["seed"], info["eligible_photos"]) == (1000, 0, 1030)
    assert (info["source_file"], info["source_sha256"]) == (source.name,
                                                            sha(source.read_bytes()))
    (tmp_path / "subset.json").write_text(json.dumps(subset))
    captions = load_captions(tmp_path / "subset.json")               # as training reads it
    assert captions.image_ids.tolist() == ids
    sizes = {k: len(v) for k, v in split_photos(captions.image_ids).items()}
    assert sizes == {"train": 600, "val": 200, "test": 200}
    with pytest.raises(ValueError) as err:
        coco.choose_subset(source, 1031, 0)
    assert str(err.value) == (f"{source}: cannot choose 1031 photos, only 1030 of its 1070 "
                              f"photos have >= 5 captions, >= 2 distinct; pass --num-photos "
                              f"1030 or fewer")


def serve_coco(srv, tmp_path, monkeypatch):
    """A 30-photo annotations zip, a vocabulary and the photos, published: the sha256s patched
    in as the real ones. Returns the subset's 10 records (of 10 photos, seed 0)."""
    source = made_up_coco(30, seed=5)
    (tmp_path / "source.json").write_text(json.dumps(source))
    for image in source["images"]:
        srv.files[f"train2017/{image['file_name']}"] = jpeg(32, 24, seed=image["id"])
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(coco.MEMBERS["train"], json.dumps(source))
        zf.writestr(coco.MEMBERS["val"], json.dumps(made_up_coco(8, seed=6)))
        zf.writestr("annotations/instances_val2017.json", "{}")     # not extracted
    srv.files["ann.zip"], srv.files["vocab.txt"] = archive.getvalue(), b"[PAD]\n[UNK]\n"
    monkeypatch.setattr(coco, "ANNOTATIONS_SHA256", sha(srv.files["ann.zip"]))
    monkeypatch.setattr(coco, "VOCAB_SHA256", sha(srv.files["vocab.txt"]))
    return coco.choose_subset(tmp_path / "source.json", 10, 0)["images"]


def test_data_end_to_end_cut_interrupted_and_rerun(https, tmp_path, monkeypatch, capsys):
    records = serve_coco(https, tmp_path, monkeypatch)
    broken = records[3]
    name = f"train2017/{broken['file_name']}"
    good, https.files[name] = https.files[name], jpeg(40, 30)      # the wrong size
    root = tmp_path / "coco"
    args = dict(root=root, num_photos=10, seed=0, workers=3,
                annotations_url=f"{https.url}/cut-once/ann.zip", images_url=f"{https.url}/files",
                vocab_url=f"{https.url}/files/vocab.txt")
    with pytest.raises(OSError) as err:
        coco.run_data(**args)
    assert str(err.value) == (
        f"{root / 'train2017'}: 1 photos could not be fetched: ids [{broken['id']}] (photo "
        f"{broken['id']}: {https.url}/files/{name}: downloaded {len(https.files[name])} bytes "
        f"with size 40x30, expected 32x24; deleted, rerun to download again); rerun `make data` "
        f"to retry")
    zip_requests = [r for path, r in https.requests if path.endswith("ann.zip")]
    assert zip_requests[0] is None and zip_requests[1].startswith("bytes=")   # resumed
    subset = root / "captions_train2017_subset10_seed0.json"
    assert json.loads(subset.read_text())["images"] == records
    assert sorted(p.name for p in root.iterdir()) == [
        ".lock", "annotations", coco.VOCAB_NAME, subset.name, "train2017"]
    assert (root / coco.VOCAB_NAME).read_bytes() == https.files["vocab.txt"]
    assert sorted(p.name for p in (root / "annotations").iterdir()) == [
        "captions_train2017.json", "captions_val2017.json"]
    photos = sorted(p.name for p in (root / "train2017").iterdir())
    assert photos == sorted(r["file_name"] for r in records if r is not broken)

    https.files[name], https.requests[:] = good, []
    first = subset.read_bytes()
    coco.run_data(**args)                                  # the rerun: only the failed photo
    assert https.requests == [(f"/files/{name}", None)] and subset.read_bytes() == first
    out = capsys.readouterr().out
    assert "captions present, skipped" in out and f"{subset}: present, skipped" in out
    assert "1 photos fetched, 9 already present" in out and "next: `make embeddings`" in out
    with Image.open(root / "train2017" / broken["file_name"]) as image:
        assert image.size == (32, 24)
