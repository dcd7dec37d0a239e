"""COCO photos -> frozen DINOv2 image embeddings -> embeddings/*.npz (run once, see
embeddings/README.md).

The one module allowed to use torch and transformers, and only inside functions, so that
`import minialign.export` works (and its Pillow helpers are testable) without them.

Pooling: the image embedding is the CLS token of DINOv2's last layer AFTER the final
LayerNorm, i.e. `Dinov2Model(...).last_hidden_state[:, 0]`. Checked in the installed
transformers 5.24.0, models/dinov2/modeling_dinov2.py, Dinov2Model.forward:
    sequence_output = self.layernorm(encoder_outputs.last_hidden_state)
    pooled_output = sequence_output[:, 0, :]
    return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=...)
(transformers 4.40 has the same two lines), and tests/test_export.py checks it on a tiny model.
"""
from __future__ import annotations

import enum
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from minialign.machinery.images.embeddings import load_embeddings, save_embeddings, sha256_file
from minialign.machinery.run.files import read_json

DEFAULT_MODEL = "facebook/dinov2-base"  # ViT-B/14 with D_img = 768 (Oquab et al. 2023)
# The commit of DEFAULT_MODEL's Hub repository that is loaded and recorded (its 2023-07-18
# release, 86.6M parameters, as public projects pin it): a later push to the repository cannot
# change the embeddings silently. --revision picks another.
DEFAULT_REVISION = "f9e44c814b77203eaa57a6bdbbd535f21ede1415"
POOLING = "CLS token of last_hidden_state (after final LayerNorm)"
WHITE = (255, 255, 255)                 # background behind transparent pixels
ALPHA_MODES = ("RGBA", "LA", "PA")      # Pillow modes with an alpha band
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # 16-bit PNG/TIFF grey
SIXTEEN_BIT_MAX = 65535                 # 16-bit samples span [0, 65535]
RGB_CONVERSION = ("alpha (RGBA, LA, PA, P/L/RGB with transparency) composited on white; "
                  "16-bit grey scaled by 255/65535; other modes Pillow convert('RGB'); "
                  "EXIF orientation not applied")
# the processor settings that decide the pixels the model sees (recorded in meta)
PREPROCESSING_KEYS = ("do_convert_rgb", "do_resize", "size", "resample", "do_center_crop",
                      "crop_size", "do_rescale", "rescale_factor", "do_normalize",
                      "image_mean", "image_std")
MODEL_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "patch_size", "image_size", "layer_norm_eps")
NUM_EXAMPLES = 5                        # file names quoted in error messages
PLAIN_PROGRESS_LINES = 10               # without a terminal: a line per ~10% (and the first batch)
# one install advice, the same here, in tests/test_export.py and in embeddings/README.md
INSTALL_ADVICE = ("with internet: pip install torch --index-url "
                  "https://download.pytorch.org/whl/cpu (CPU build, ~190 MB) BEFORE "
                  "pip install -e '.[export]', which would otherwise pull the multi-GB CUDA "
                  "build; --device cuda needs a CUDA build of torch instead "
                  "(embeddings/README.md)")


def read_captioned_photos(captions_path):
    """The photos of a COCO captions JSON that have at least one caption.
    Returns a list of (image_id, file_name), sorted by image_id.
    Raises ValueError naming the file if it lacks `images`/`annotations` or has no photo."""
    coco = read_json(captions_path, "COCO captions JSON")
    try:
        captioned = {int(a["image_id"]) for a in coco["annotations"]}
        photos = sorted((int(image["id"]), str(image["file_name"])) for image in coco["images"]
                        if int(image["id"]) in captioned)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{captions_path}: not a COCO captions file (missing {err})") from err
    if not photos:
        raise ValueError(f"{captions_path}: no photo has a caption")
    return photos


def choose_photos(photos, num_photos, seed):
    """A deterministic subset: the first num_photos of np.random.default_rng(seed)'s
    permutation of the id-sorted photos, returned sorted by id. num_photos None keeps all."""
    if num_photos is None:
        return list(photos)
    if not 1 <= num_photos <= len(photos):
        raise ValueError(f"num_photos must be in [1, {len(photos)}], got {num_photos}")
    chosen = np.sort(np.random.default_rng(seed).permutation(len(photos))[:num_photos])
    return [photos[i] for i in chosen]


def find_image_files(photos, images_dir):
    """images_dir / file_name for each (image_id, file_name). Raises FileNotFoundError saying
    how many are missing, with a few names, before any model is loaded."""
    paths = [Path(images_dir) / file_name for _, file_name in photos]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(paths)} captioned photos have no "
                                f"image in {images_dir} (e.g. {missing[:NUM_EXAMPLES]}); "
                                f"download the matching COCO split (embeddings/README.md)")
    return paths


def to_rgb(image):
    """Any Pillow image -> mode RGB, 8 bits per channel.
    Transparent pixels are composited on white, not dropped: Pillow's plain convert('RGB')
    would show whatever colour hides under alpha = 0 (often black). 16-bit grey is scaled
    to 8 bits; Pillow's convert would clip every value above 255 to white. Everything else
    (L, 1, P, CMYK, YCbCr, ...) uses Pillow's convert('RGB')."""
    if image.mode == "RGB":
        return image
    if image.mode in SIXTEEN_BIT_MODES:
        grey = np.asarray(image, dtype=np.float64) * (255 / SIXTEEN_BIT_MAX)   # (H, W)
        grey = np.clip(np.rint(grey), 0, 255).astype(np.uint8)                 # (H, W)
        return Image.fromarray(grey).convert("RGB")
    if image.mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def load_rgb(path):
    """Decode one image file fully and convert it with to_rgb.
    Raises ValueError naming the file if Pillow cannot decode it (garbage, truncated)."""
    try:
        with open(path, "rb") as f:
            image = Image.open(f)
            image.load()  # decode now, while the file is open: errors surface here
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{path}: cannot decode image: {err}") from err
    return to_rgb(image)


def json_safe(value):
    """Processor settings as JSON: tuples -> lists, enums (Pillow filters) -> their value."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value.value if isinstance(value, enum.Enum) else value


def preprocessing_meta(processor):
    """The processor's resize / crop / rescale / normalise settings, its class, and how
    images became RGB, as a JSON-ready dict."""
    settings = processor.to_dict()
    meta = {k: json_safe(settings[k]) for k in PREPROCESSING_KEYS if k in settings}
    meta["image_processor_class"] = type(processor).__name__
    meta["rgb_conversion"] = RGB_CONVERSION
    return meta


def require_export_deps():
    """Import torch and transformers, or say how to install them."""
    try:
        import torch
        import transformers
    except ImportError as err:
        raise ImportError(f"the export needs torch and transformers ({err}); "
                          f"{INSTALL_ADVICE}") from err
    return torch, transformers


def load_pretrained(transformers, model_name, revision=DEFAULT_REVISION, model=None,
                    processor=None):
    """(model, processor): those given, else Dinov2Model / AutoImageProcessor.from_pretrained
    at `revision` (a commit of the Hub repository), safetensors weights only (never a pickled
    .bin, which can run code when loaded) and no code from the repository.
    model_name: a Hugging Face Hub name (downloaded on first use, then cached) or a local
    folder (read as it is: transformers ignores revision there, see export_embeddings).
    Raises FileNotFoundError naming it, chained to from_pretrained's OSError (no internet,
    unknown name or revision, missing folder, no safetensors file), so the command line
    prints one clear line."""
    pinned = {"revision": revision, "trust_remote_code": False}
    try:
        if model is None:
            model = transformers.Dinov2Model.from_pretrained(model_name, use_safetensors=True,
                                                             **pinned)
        if processor is None:
            processor = transformers.AutoImageProcessor.from_pretrained(model_name, **pinned)
    except OSError as err:
        raise FileNotFoundError(
            f"cannot load the model {model_name!r} at revision {revision}: {err}\nA Hub name "
            f"such as {DEFAULT_MODEL} "
            f"is downloaded from the Hugging Face Hub on first use (internet needed once, "
            f"~350 MB), then read from the local cache; without internet, pass a local folder "
            f"holding the model and its preprocessor_config.json with --model") from err
    return model, processor


def embed_images(model, processor, images, device):
    """DINOv2 CLS embeddings of a list of B RGB Pillow images -> (B, D_img) float32."""
    import torch
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]  # (B, 3, H, W)
    with torch.inference_mode():
        outputs = model(pixel_values=pixel_values.to(device))
    cls = outputs.last_hidden_state[:, 0]  # (B, D_img) CLS token, after the final LayerNorm
    return cls.float().cpu().numpy()


def plain_progress_due(before, after, total, lines=PLAIN_PROGRESS_LINES):
    """Whether a plain progress line is due after the count went from `before` to `after`
    of `total`: after the first batch, and each time the count crosses a multiple of
    total / lines (so about `lines` lines in all, the last one at total)."""
    return before == 0 or after * lines // total > before * lines // total


def plain_progress_line(desc, done, total, seconds):
    """One progress line without carriage returns, for a log file: count, percent, img/s
    and the estimated minutes left, e.g. "export m: 50/100 images (50%), 2.5 img/s, eta 0.3 min"."""
    rate = done / seconds if seconds > 0 else float("inf")
    eta = (total - done) / rate / 60 if rate > 0 else float("inf")
    return (f"{desc}: {done}/{total} images ({100 * done // total}%), {rate:.1f} img/s, "
            f"eta {eta:.1f} min")


def export_embeddings(captions_path, images_dir, out_path, model_name=DEFAULT_MODEL,
                      batch_size=32, device="cpu", num_photos=None, seed=0, model=None,
                      processor=None, force=False, progress=None, revision=DEFAULT_REVISION):
    """Embed every captioned photo of a COCO captions JSON with a frozen DINOv2 and write
    out_path (format: minialign/embeddings.py) via save_embeddings.
    captions_path: COCO captions JSON; images_dir: folder holding its `file_name`s.
    revision: the commit of model_name's Hub repository to load (load_pretrained), recorded
    as meta["revision"]; for a local folder it cannot be checked, and a note says so.
    num_photos, seed: optional subset (choose_photos). model, processor: a Dinov2Model and
    an image processor to use instead of loading from_pretrained(model_name). progress: True
    for a tqdm bar on stderr, False for plain lines on stderr (plain_progress_line, about one
    per 10%: no carriage returns in a log file), None to pick by whether stderr is a terminal.
    Returns the written file loaded back as ImageEmbeddings: image_ids (N,) sorted int64,
    embeddings (N, D_img) float32. Raises FileExistsError (out_path exists, not force),
    FileNotFoundError (image files missing), ValueError (an image does not decode; nothing
    is written), TypeError (model is not a Dinov2Model), ImportError (no torch/transformers),
    FileNotFoundError (model_name cannot be loaded: see load_pretrained)."""
    out_path = Path(out_path)
    if out_path.exists() and not force:  # checked now, not after an hour of compute
        raise FileExistsError(f"{out_path} already exists; pass force=True (--force) to replace it")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    photos = choose_photos(read_captioned_photos(captions_path), num_photos, seed)
    paths = find_image_files(photos, images_dir)
    torch, transformers = require_export_deps()
    if model is None and Path(model_name).is_dir():
        print(f"note: --model {model_name} is a local folder, read as it is; recording "
              f"--revision {revision} as given (transformers cannot check it)", file=sys.stderr)
    model, processor = load_pretrained(transformers, model_name, revision, model, processor)
    if not isinstance(model, transformers.Dinov2Model):
        raise TypeError(f"model must be a transformers Dinov2Model, got {type(model).__name__}")
    model = model.to(device).eval()
    rows, desc = [], f"export {model_name}"
    use_bar = sys.stderr.isatty() if progress is None else progress
    t0 = time.perf_counter()
    with tqdm(total=len(paths), unit="img", desc=desc, disable=not use_bar) as bar:
        for start in range(0, len(paths), batch_size):
            images = [load_rgb(p) for p in paths[start:start + batch_size]]
            rows.append(embed_images(model, processor, images, device))  # (b, D_img)
            bar.update(len(images))
            done = start + len(images)
            if not use_bar and plain_progress_due(start, done, len(paths)):
                print(plain_progress_line(desc, done, len(paths), time.perf_counter() - t0),
                      file=sys.stderr, flush=True)
    embeddings = np.concatenate(rows)                                     # (N, D_img)
    config = model.config.to_dict()
    meta = {"model": model_name, "revision": revision,
            "model_config": {k: json_safe(config[k]) for k in MODEL_CONFIG_KEYS if k in config},
            "model_dtype": str(next(model.parameters()).dtype),
            "preprocessing": preprocessing_meta(processor),
            "pooling": POOLING,
            "captions_file": Path(captions_path).name,
            "captions_sha256": sha256_file(captions_path),
            "num_photos": num_photos, "seed": seed,
            "batch_size": batch_size, "device": str(device),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}
    image_ids = np.array([image_id for image_id, _ in photos], dtype=np.int64)  # (N,)
    save_embeddings(out_path, image_ids, embeddings, meta, force=force)
    return load_embeddings(out_path)


def run_export(captions, images, out, **options):
    """`python -m minialign export`: export_embeddings(captions, images, out, **options); print
    the file's shape and its sha256 line (the same line `sha256sum` prints). Returns 0."""
    emb = export_embeddings(captions, images, out, **options)
    print(f"wrote {emb.path}: {emb.meta['count']} photos x {emb.meta['dim']} "
          f"{emb.meta['dtype']}, {emb.meta['model']} at revision {emb.meta['revision']}, "
          f"{emb.meta['pooling']}")
    print(f"{sha256_file(emb.path)}  {emb.path}")
    return 0
