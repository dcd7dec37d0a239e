"""The DINOv2 export, run with a tiny randomly initialised Dinov2Model on the 12 real COCO
photos in ../shared/coco (no download). Pillow-only helpers are tested without torch."""
import argparse
import json
import shutil

import numpy as np
import pytest
from conftest import SHARED_COCO
from PIL import Image

from minialign.machinery.images.embeddings import load_embeddings, sha256_file
from minialign.machinery.cli import add_export_args, run_export
from minialign.machinery.images.export import (DEFAULT_REVISION, POOLING, choose_photos,
                                               export_embeddings, load_pretrained, load_rgb,
                                               plain_progress_due, plain_progress_line, to_rgb)

COCO_DIR = SHARED_COCO
IMAGES_DIR = COCO_DIR / "images"
GRAYSCALE_ID = 431848  # 000000431848.jpg is mode L
# facebook/dinov2-base's preprocessor_config.json, shrunk from 256 -> 224 to 64 -> 56 pixels
TINY_PREPROCESSOR = {"image_processor_type": "BitImageProcessor",
                     "do_convert_rgb": True, "do_resize": True, "size": {"shortest_edge": 64},
                     "resample": 3, "do_center_crop": True,
                     "crop_size": {"height": 56, "width": 56},
                     "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                     "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
TINY_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   mlp_ratio=2, patch_size=14, image_size=56)  # MLP width 2 * 32 = 64
NEEDS_TORCH = ("export tests need torch + transformers: pip install torch --index-url "
               "https://download.pytorch.org/whl/cpu (CPU build, ~190 MB) first, "
               "then pip install -e '.[export]'")


def write_coco(path, images, annotations):
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


@pytest.fixture(scope="module")
def coco_12(tmp_path_factory):
    """A COCO captions JSON restricted to the 12 shared photos, with their real captions."""
    if not (COCO_DIR / "captions_val2017.json").is_file() or not IMAGES_DIR.is_dir():
        pytest.skip(f"shared COCO test data not found in {COCO_DIR}")
    ids = {int(p.stem) for p in IMAGES_DIR.glob("*.jpg")}
    coco = json.loads((COCO_DIR / "captions_val2017.json").read_text())
    return write_coco(tmp_path_factory.mktemp("coco") / "captions_12.json",
                      [im for im in coco["images"] if im["id"] in ids],
                      [a for a in coco["annotations"] if a["image_id"] in ids]), sorted(ids)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model, processor, folder): a seeded random tiny Dinov2Model and a DINOv2-style
    processor, also saved to a folder that from_pretrained can read offline."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    transformers = pytest.importorskip("transformers", reason=NEEDS_TORCH)
    folder = tmp_path_factory.mktemp("tiny_dinov2")
    (folder / "preprocessor_config.json").write_text(json.dumps(TINY_PREPROCESSOR))
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    torch.manual_seed(0)
    model = transformers.Dinov2Model(transformers.Dinov2Config(**TINY_CONFIG)).eval()
    model.save_pretrained(folder)
    return model, processor, folder


@pytest.fixture(scope="module")
def exported(coco_12, tiny, tmp_path_factory):
    (captions, ids), (model, processor, _) = coco_12, tiny
    out = tmp_path_factory.mktemp("out") / "tiny.npz"
    return export_embeddings(captions, IMAGES_DIR, out, model_name="tiny-random-dinov2",
                             batch_size=5, model=model, processor=processor)


def test_to_rgb_every_mode():
    rgba = Image.new("RGBA", (2, 1), (10, 20, 30, 255)); rgba.putpixel((1, 0), (0, 0, 0, 0))
    palette = Image.new("P", (2, 1), 0); palette.putpalette([0, 0, 0, 200, 0, 0])
    palette.putpixel((1, 0), 1); palette.info["transparency"] = 0
    grey16 = Image.fromarray(np.array([[0, 65535, 32768]], dtype=np.uint16))
    cases = {"L": (Image.new("L", (2, 1), 77), (77, 77, 77)),
             "1": (Image.new("1", (2, 1), 1), (255, 255, 255)),
             "CMYK": (Image.new("CMYK", (2, 1), (0, 0, 0, 0)), (255, 255, 255)),
             "RGBA opaque": (rgba, (10, 20, 30)),
             "LA transparent": (Image.new("LA", (2, 1), (0, 0)), (255, 255, 255)),
             "P transparent": (palette, (255, 255, 255)),
             "I;16 black": (grey16, (0, 0, 0))}
    for name, (image, first_pixel) in cases.items():
        rgb = to_rgb(image)
        assert rgb.mode == "RGB" and rgb.size == image.size, name
        assert rgb.getpixel((0, 0)) == first_pixel, name
    assert to_rgb(rgba).getpixel((1, 0)) == (255, 255, 255)        # transparent -> white
    assert to_rgb(palette).getpixel((1, 0)) == (200, 0, 0)         # opaque palette colour
    assert [to_rgb(grey16).getpixel((x, 0))[0] for x in range(3)] == [0, 255, 128]


def test_load_rgb_grayscale_and_corrupt(tmp_path):
    if not (IMAGES_DIR / f"{GRAYSCALE_ID:012d}.jpg").is_file():
        pytest.skip(f"shared COCO test images not found in {IMAGES_DIR}")
    with Image.open(IMAGES_DIR / f"{GRAYSCALE_ID:012d}.jpg") as image:
        assert image.mode == "L"
    assert load_rgb(IMAGES_DIR / f"{GRAYSCALE_ID:012d}.jpg").mode == "RGB"
    bad = tmp_path / "000000000001.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" * 20)
    with pytest.raises(ValueError, match="000000000001.jpg"):
        load_rgb(bad)


def test_choose_photos_is_seeded_and_sorted():
    photos = [(i, f"{i:012d}.jpg") for i in range(100, 200)]
    a, b = choose_photos(photos, 10, seed=0), choose_photos(photos, 10, seed=0)
    assert a == b and a == sorted(a) and len(a) == 10
    assert choose_photos(photos, 10, seed=1) != a
    assert choose_photos(photos, None, seed=0) == photos
    with pytest.raises(ValueError, match="num_photos"):
        choose_photos(photos, 101, seed=0)


def test_missing_images_are_listed_before_any_model(tmp_path):
    (tmp_path / "000000000001.jpg").write_bytes(b"")
    captions = write_coco(tmp_path / "c.json",
                          [{"id": i, "file_name": f"{i:012d}.jpg"} for i in (1, 2, 3)],
                          [{"image_id": i, "id": i, "caption": "a cat"} for i in (1, 2, 3)])
    with pytest.raises(FileNotFoundError, match="2 of 3") as info:
        export_embeddings(captions, tmp_path, tmp_path / "out.npz", model=object())
    assert "000000000002.jpg" in str(info.value)
    assert not (tmp_path / "out.npz").exists()


def test_unloadable_model_is_a_friendly_error(tmp_path):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    pytest.importorskip("transformers", reason=NEEDS_TORCH)
    (tmp_path / "000000000001.jpg").write_bytes(b"")     # present: the model load comes next
    captions = write_coco(tmp_path / "c.json", [{"id": 1, "file_name": "000000000001.jpg"}],
                          [{"image_id": 1, "id": 9, "caption": "a cat"}])
    absent = tmp_path / "no_such_model"                  # a path: fails at once, no network
    with pytest.raises(FileNotFoundError) as info:
        export_embeddings(captions, tmp_path, tmp_path / "out.npz", model_name=str(absent))
    message = str(info.value)
    assert repr(str(absent)) in message and "Hugging Face Hub on first use" in message
    assert "internet needed once" in message and "--model" in message
    assert isinstance(info.value.__cause__, OSError)     # from_pretrained's own error, chained
    assert not (tmp_path / "out.npz").exists()


def test_the_pinned_revision_is_loaded_with_safetensors_and_no_remote_code():
    calls = []

    class Loader:                                       # stands in for a from_pretrained class
        @staticmethod
        def from_pretrained(name, **options):
            calls.append((name, options))
            return name
    fake = argparse.Namespace(Dinov2Model=Loader, AutoImageProcessor=Loader)
    assert DEFAULT_REVISION == "f9e44c814b77203eaa57a6bdbbd535f21ede1415"
    assert load_pretrained(fake, "facebook/dinov2-base") == ("facebook/dinov2-base",) * 2
    pinned = {"revision": DEFAULT_REVISION, "trust_remote_code": False}
    assert calls == [("facebook/dinov2-base", {"use_safetensors": True, **pinned}),
                     ("facebook/dinov2-base", pinned)]
    assert add_export_args(argparse.ArgumentParser()).parse_args(
        ["--captions", "c", "--images", "i", "--out", "o"]).revision == DEFAULT_REVISION


def test_pickled_weights_are_refused(tiny, tmp_path):
    transformers = pytest.importorskip("transformers", reason=NEEDS_TORCH)
    model, _, folder = tiny
    pickled = tmp_path / "pickled"
    shutil.copytree(folder, pickled)
    for weights in pickled.glob("*.safetensors"):       # only a torch.save .bin left
        weights.unlink()
    torch = pytest.importorskip("torch")
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="cannot load the model"):
        load_pretrained(transformers, str(pickled))


def test_export_shape_ids_and_meta(exported, coco_12):
    _, ids = coco_12
    assert exported.embeddings.shape == (12, 32) and exported.embeddings.dtype == np.float32
    assert np.isfinite(exported.embeddings).all()
    np.testing.assert_array_equal(exported.image_ids, ids)        # sorted, all 12
    assert GRAYSCALE_ID in exported.image_ids
    assert exported.meta["pooling"] == POOLING and exported.meta["model"] == "tiny-random-dinov2"
    assert exported.meta["revision"] == DEFAULT_REVISION          # the default, as recorded
    assert exported.meta["preprocessing"]["crop_size"] == {"height": 56, "width": 56}
    assert exported.meta["captions_sha256"] == sha256_file(coco_12[0])
    assert exported.embeddings.std(axis=0).min() > 0              # photos differ


def test_export_is_deterministic(exported, coco_12, tiny, tmp_path):
    (captions, _), (model, processor, _) = coco_12, tiny
    again = export_embeddings(captions, IMAGES_DIR, tmp_path / "tiny.npz",
                              model_name="tiny-random-dinov2", batch_size=5, model=model,
                              processor=processor)
    assert again.embeddings.tobytes() == exported.embeddings.tobytes()
    assert sha256_file(again.path) == sha256_file(exported.path)  # the whole file, too


def test_export_is_cls_after_final_layernorm(exported, tiny):
    torch = pytest.importorskip("torch")
    model, processor, _ = tiny
    image = load_rgb(IMAGES_DIR / f"{GRAYSCALE_ID:012d}.jpg")
    pixel_values = processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model(pixel_values=pixel_values, output_hidden_states=True)
        after_ln = model.layernorm(out.hidden_states[-1])                 # (1, T, D_img)
    row = int(np.flatnonzero(exported.image_ids == GRAYSCALE_ID)[0])
    # one image alone vs a batch of 5 in the export: allow float32 summation-order noise
    np.testing.assert_allclose(exported.embeddings[row], out.last_hidden_state[0, 0].numpy(),
                               rtol=1e-5, atol=1e-6)
    # last_hidden_state is the last block's output passed through the final LayerNorm
    np.testing.assert_array_equal(after_ln.numpy(), out.last_hidden_state.numpy())


def test_corrupt_image_raises_and_writes_nothing(tiny, tmp_path):
    model, processor, _ = tiny
    (tmp_path / "000000000001.jpg").write_bytes(b"garbage, not a jpeg" * 50)
    captions = write_coco(tmp_path / "c.json", [{"id": 1, "file_name": "000000000001.jpg"}],
                          [{"image_id": 1, "id": 9, "caption": "a broken photo"}])
    with pytest.raises(ValueError, match="000000000001.jpg"):
        export_embeddings(captions, tmp_path, tmp_path / "out.npz", model=model,
                          processor=processor)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000001.jpg", "c.json"]


def test_cli_loads_from_pretrained_folder(exported, coco_12, tiny, tmp_path, capsys):
    (captions, _), (_, _, folder) = coco_12, tiny
    out, revision = tmp_path / "cli.npz", "0123456789abcdef0123456789abcdef01234567"
    argv = ["--captions", str(captions), "--images", str(IMAGES_DIR), "--model", str(folder),
            "--out", str(out), "--batch-size", "5", "--num-photos", "4", "--revision", revision]
    args = add_export_args(argparse.ArgumentParser()).parse_args(argv)
    assert run_export(args) == 0
    printed = capsys.readouterr()
    assert f"{sha256_file(out)}  {out}" in printed.out and f"at revision {revision}" in printed.out
    assert printed.err.splitlines()[0] == (
        f"note: --model {folder} is a local folder, read as it is; recording --revision "
        f"{revision} as given (transformers cannot check it)")
    emb = load_embeddings(out)
    assert emb.meta["revision"] == revision and emb.meta["model"] == str(folder)
    assert emb.image_ids.shape == (4,) and emb.meta["num_photos"] == 4
    rows = np.searchsorted(exported.image_ids, emb.image_ids)      # same weights, same pixels
    np.testing.assert_allclose(emb.embeddings, exported.embeddings[rows], rtol=1e-5, atol=1e-6)
    with pytest.raises(FileExistsError, match="cli.npz"):         # refused before any work
        run_export(args)


def test_plain_progress_lines_every_tenth_without_carriage_returns():
    total, batch = 100, 7
    due = [after for before, after in ((s, min(s + batch, total)) for s in range(0, total, batch))
           if plain_progress_due(before, after, total)]
    assert due == [7, 14, 21, 35, 42, 56, 63, 70, 84, 91, 100]    # first batch, then per 10%
    assert [plain_progress_due(0, 12, 12), plain_progress_due(5, 10, 12)] == [True, True]
    line = plain_progress_line("export m", 50, 200, 20.0)
    assert line == "export m: 50/200 images (25%), 2.5 img/s, eta 1.0 min"
    assert "\r" not in line and "\n" not in line


def test_export_log_without_terminal_has_plain_lines(coco_12, tiny, tmp_path, capsys):
    (captions, _), (model, processor, _) = coco_12, tiny
    for progress in (None, False):                  # None: stderr is captured, not a terminal
        export_embeddings(captions, IMAGES_DIR, tmp_path / f"{progress}.npz", model=model,
                          model_name="m", processor=processor, batch_size=5, progress=progress)
        err = capsys.readouterr().err
        assert "\r" not in err
        lines = err.splitlines()
        assert [line.split(" images")[0] for line in lines] == [
            "export m: 5/12", "export m: 10/12", "export m: 12/12"]
        assert all(" img/s, eta " in line for line in lines)
