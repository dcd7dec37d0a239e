"""export.py on a tiny randomly initialised Dinov2Model saved to a folder (no download) and
photos made here: the file's format, its rows the CLS token after the final LayerNorm, inputs
checked before any work, resume after an interruption; to_rgb by hand."""
import argparse
import json

import numpy as np
import pytest
from PIL import Image

from minialign.machinery import export
from minialign.machinery.runs import sha256_file

NEEDS = "the export needs torch and transformers (make install-export)"
# facebook/dinov2-base's preprocessor_config.json, 256 -> 224 pixels shrunk to 64 -> 56
TINY_PREPROCESSOR = {"image_processor_type": "BitImageProcessor", "do_convert_rgb": True,
                     "do_resize": True, "size": {"shortest_edge": 64}, "resample": 3,
                     "do_center_crop": True, "crop_size": {"height": 56, "width": 56},
                     "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                     "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
TINY_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                   patch_size=14, image_size=56)
META_KEYS = {"model", "revision", "model_config", "model_dtype", "preprocessing", "pooling",
             "captions_file", "captions_sha256", "batch_size", "device", "torch_version",
             "transformers_version", "dtype", "count", "dim"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A folder holding a seeded random tiny Dinov2Model and a DINOv2-style processor."""
    torch = pytest.importorskip("torch", reason=NEEDS)
    transformers = pytest.importorskip("transformers", reason=NEEDS)
    folder = tmp_path_factory.mktemp("tiny_dinov2")
    (folder / "preprocessor_config.json").write_text(json.dumps(TINY_PREPROCESSOR))
    torch.manual_seed(0)
    transformers.Dinov2Model(transformers.Dinov2Config(**TINY_CONFIG)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """7 photos (one grey, sizes differ) in a folder and a captions file; photo 99 has no
    caption, so it is not exported. Returns (captions path, images folder, exported ids)."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    ids = [42, 7, 99, 13, 5, 21, 8]
    for k, i in enumerate(ids):
        pixels = rng.integers(0, 256, (60 + 4 * k, 70, 3), dtype=np.uint8)
        Image.fromarray(pixels if k else pixels[..., 0]).save(folder / f"{i:012d}.jpg")
    coco = {"images": [{"id": i, "file_name": f"{i:012d}.jpg"} for i in ids],
            "annotations": [{"image_id": i, "id": k, "caption": "a photo"}
                            for k, i in enumerate(ids) if i != 99]}
    (folder / "captions.json").write_text(json.dumps(coco))
    return folder / "captions.json", folder, sorted(set(ids) - {99})


def test_the_file_and_its_rows(tiny, photos, tmp_path, capsys):
    """The format images.py reads, and each row the CLS token after the final LayerNorm of
    the photo of its id (the grey one as RGB), whatever batch it was in."""
    import torch
    import transformers
    captions, images, ids = photos
    out = tmp_path / "e.npz"
    export.run_export(captions, images, out, model_name=str(tiny), batch_size=4)
    printed = capsys.readouterr()
    assert printed.out.splitlines() == [
        f"wrote {out}: 6 photos x 32 float32, {tiny} at revision {export.DEFAULT_REVISION}, "
        f"{export.POOLING}", f"{sha256_file(out)}  {out}"]
    assert printed.err.startswith(f"note: --model {tiny} is a local folder, read as it is")
    with np.load(out, allow_pickle=False) as f:
        assert sorted(f.files) == ["embeddings", "image_ids", "meta"]
        image_ids, embeddings, meta = f["image_ids"], f["embeddings"], json.loads(str(f["meta"]))
    assert image_ids.dtype == np.int64 and image_ids.tolist() == ids
    assert embeddings.dtype == np.float32 and embeddings.shape == (6, 32)
    assert set(meta) == META_KEYS and (meta["count"], meta["dim"], meta["dtype"]) == (
        6, 32, "float32")
    assert meta["captions_sha256"] == sha256_file(captions) and meta["pooling"] == export.POOLING
    assert meta["preprocessing"]["crop_size"] == {"height": 56, "width": 56}
    model = transformers.Dinov2Model.from_pretrained(tiny).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(tiny)
    for row in (0, 5):                           # photo 5, and the grey 42 in the 2nd batch
        image = Image.open(images / f"{ids[row]:012d}.jpg").convert("RGB")
        with torch.no_grad():
            got = model(**processor(images=[image], return_tensors="pt"),
                        output_hidden_states=True)
            cls = model.layernorm(got.hidden_states[-1])[0, 0].numpy()   # last block, then LN
        np.testing.assert_allclose(embeddings[row], cls, rtol=1e-5, atol=1e-6)
    assert np.abs(embeddings[0] - embeddings[1]).max() > 1e-3          # photos differ


def test_inputs_are_checked_before_any_work(photos, tmp_path, monkeypatch):
    captions, images, _ = photos
    missing = tmp_path / "images"
    missing.mkdir()
    (missing / "000000000005.jpg").write_bytes((images / "000000000005.jpg").read_bytes())
    monkeypatch.setattr(export, "load_pretrained", None)             # never reached
    with pytest.raises(FileNotFoundError) as err:
        export.run_export(captions, missing, tmp_path / "e.npz")
    assert str(err.value).startswith(f"{missing}: 5 of the 6 captioned photos of {captions} "
                                     f"are missing (e.g. ['000000000007.jpg', ")
    (tmp_path / "e.npz").write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="e.npz: already exists; pass --force"):
        export.run_export(captions, images, tmp_path / "e.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npz", "images"]


def test_a_photo_that_does_not_decode_is_named(tiny, photos, tmp_path):
    captions, images, _ = photos
    broken = tmp_path / "images"
    broken.mkdir()
    for p in images.glob("*.jpg"):
        broken.joinpath(p.name).write_bytes(p.read_bytes()[:300 if p.stem.endswith("13") else None])
    with pytest.raises(ValueError, match=r"000000000013\.jpg: cannot decode the image"):
        export.run_export(captions, broken, tmp_path / "e.npz", model_name=str(tiny))
    assert not (tmp_path / "e.npz").exists()


def test_an_interrupted_export_resumes_where_it_stopped(tiny, photos, tmp_path, monkeypatch):
    captions, images, _ = photos
    export.run_export(captions, images, tmp_path / "whole.npz", model_name=str(tiny), batch_size=2)
    loaded, real = [], export.load_rgb

    def load_rgb(path):                                  # Ctrl-C while loading the 5th photo
        loaded.append(path.name)
        if len(loaded) == 5:
            raise KeyboardInterrupt
        return real(path)
    monkeypatch.setattr(export, "load_rgb", load_rgb)
    out = tmp_path / "e.npz"
    with pytest.raises(KeyboardInterrupt):
        export.run_export(captions, images, out, model_name=str(tiny), batch_size=2,
                                 save_every=1)
    assert not out.exists() and (tmp_path / "e.npz.partial.npz").exists()
    loaded.clear()
    export.run_export(captions, images, out, model_name=str(tiny), batch_size=2, save_every=1)
    assert loaded == ["000000000021.jpg", "000000000042.jpg"]        # only the last batch
    assert not (tmp_path / "e.npz.partial.npz").exists()
    with np.load(out) as f, np.load(tmp_path / "whole.npz") as whole:
        np.testing.assert_array_equal(f["embeddings"], whole["embeddings"])


def test_the_pinned_revision_safetensors_and_no_remote_code():
    calls = []

    class Loader:
        @staticmethod
        def from_pretrained(name, **options):
            calls.append((name, options))
            return name
    fake = argparse.Namespace(Dinov2Model=Loader, AutoImageProcessor=Loader)
    assert export.DEFAULT_REVISION == "f9e44c814b77203eaa57a6bdbbd535f21ede1415"
    assert export.load_pretrained(fake, "facebook/dinov2-base") == ("facebook/dinov2-base",) * 2
    pinned = {"revision": export.DEFAULT_REVISION, "trust_remote_code": False}
    assert calls == [("facebook/dinov2-base", {"use_safetensors": True, **pinned}),
                     ("facebook/dinov2-base", pinned)]


def test_to_rgb_composites_on_white_and_scales_16_bit_grey():
    rgba = Image.new("RGBA", (2, 1), (10, 20, 30, 255))
    rgba.putpixel((1, 0), (0, 0, 0, 0))
    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([0, 0, 0, 200, 0, 0])
    palette.putpixel((1, 0), 1)
    palette.info["transparency"] = 0
    grey16 = Image.fromarray(np.array([[0, 65535, 32768]], dtype=np.uint16))
    cases = [(rgba, [(10, 20, 30), (255, 255, 255)]), (palette, [(255, 255, 255), (200, 0, 0)]),
             (Image.new("LA", (2, 1), (77, 0)), [(255, 255, 255)] * 2),
             (Image.new("L", (2, 1), 77), [(77, 77, 77)] * 2),
             (Image.new("CMYK", (2, 1), (0, 0, 0, 0)), [(255, 255, 255)] * 2),
             (grey16, [(0, 0, 0), (255, 255, 255), (128, 128, 128)])]
    for image, pixels in cases:
        rgb = export.to_rgb(image)
        assert rgb.mode == "RGB" and [rgb.getpixel((x, 0)) for x in range(len(pixels))] == pixels
