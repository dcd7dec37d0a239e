"""`python -m minialign export`: COCO photos -> frozen DINOv2's CLS token (after the final
LayerNorm) -> the embeddings .npz (images.py), resumable from OUT.partial.npz (same meta)."""
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from .runs import load_npz, read_json, savez, sha256_file

DEFAULT_MODEL = "facebook/dinov2-base"      # ViT-B/14, D_img = 768 (Oquab et al. 2023)
DEFAULT_REVISION = "f9e44c814b77203eaa57a6bdbbd535f21ede1415"   # its Hub commit, 2023-07-18
POOLING = "CLS token of last_hidden_state (after final LayerNorm)"


def to_rgb(image):
    """Any Pillow image -> 8-bit RGB: alpha composited on white, 16-bit grey scaled, unclipped."""
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        grey = np.rint(np.asarray(image, dtype=np.float64) * (255 / 65535))     # (H, W)
        return Image.fromarray(np.clip(grey, 0, 255).astype(np.uint8)).convert("RGB")
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def load_rgb(path):
    try:
        with Image.open(path) as image:
            image.load()
            return to_rgb(image)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{path}: cannot decode the image ({err})") from None


def load_pretrained(transformers, model_name, revision=DEFAULT_REVISION):
    """(Dinov2Model, AutoImageProcessor) at `revision`, safetensors only, no repository code."""
    pinned = {"revision": revision, "trust_remote_code": False}
    try:
        model = transformers.Dinov2Model.from_pretrained(model_name, use_safetensors=True, **pinned)
        return model, transformers.AutoImageProcessor.from_pretrained(model_name, **pinned)
    except OSError as err:
        raise FileNotFoundError(f"{model_name}: cannot load the model at revision {revision} "
                                f"({err}); a Hub name needs internet once (~350 MB), or pass a "
                                f"local folder with --model".replace("\n", " ")) from err


def run_export(captions, images, out, model_name=DEFAULT_MODEL, revision=DEFAULT_REVISION,
               batch_size=32, device="cpu", force=False, save_every=20):
    """Embed the captioned photos (files in `images`) into out, inputs checked before the model
    loads; print the file's shape and its `sha256sum` line."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: already exists; pass --force to replace it")
    coco = read_json(captions)
    try:
        captioned = {int(a["image_id"]) for a in coco["annotations"]}
        photos = sorted((int(im["id"]), str(im["file_name"])) for im in coco["images"]
                        if int(im["id"]) in captioned)                 # [(image_id, file_name)]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{captions}: not a COCO captions file ({err!r})") from None
    paths = [Path(images) / name for _, name in photos]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{images}: {len(missing)} of the {len(paths)} captioned photos "
                                f"of {captions} are missing (e.g. {missing[:5]}); `make data` "
                                f"fetches them")
    try:
        import torch
        import transformers
    except ImportError as err:
        raise ImportError(f"the export needs torch and transformers ({err}): `make "
                          f"install-export` installs them (torch's CPU build)") from None
    if Path(model_name).is_dir():
        print(f"note: --model {model_name} is a local folder, read as it is; recording "
              f"--revision {revision} as given (transformers cannot check it)", file=sys.stderr)
    model, processor = load_pretrained(transformers, model_name, revision)
    model = model.to(device).eval()
    meta = {"model": model_name, "revision": revision, "pooling": POOLING,
            "model_config": model.config.to_dict(), "preprocessing": processor.to_dict(),
            "model_dtype": str(next(model.parameters()).dtype), "device": str(device),
            "captions_file": Path(captions).name, "captions_sha256": sha256_file(captions),
            "batch_size": batch_size, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}
    made_under = json.dumps(meta, sort_keys=True, default=str)   # str: e.g. a resampling enum
    partial = out.with_name(out.name + ".partial.npz")
    saved = load_npz(partial) if partial.is_file() else None
    rows = [saved["embeddings"]] if saved is not None and str(saved["meta"]) == made_under else []
    if saved is not None and not rows:
        print(f"note: {partial} was made with other settings; starting over", file=sys.stderr)
    done = len(rows[0]) if rows else 0
    with tqdm(total=len(paths), initial=done, unit="photo", desc=f"export {model_name}",
              disable=None) as bar:                       # None: a bar on a terminal only
        for b, start in enumerate(range(done, len(paths), batch_size), 1):
            batch = [load_rgb(p) for p in paths[start:start + batch_size]]
            pixels = processor(images=batch, return_tensors="pt")["pixel_values"]  # (B,3,H,W)
            with torch.inference_mode():
                hidden = model(pixel_values=pixels.to(device)).last_hidden_state  # (B, T, D)
            rows.append(hidden[:, 0].float().cpu().numpy())                 # (B, D_img) CLS
            bar.update(len(batch))
            if b % save_every == 0:
                savez(partial, embeddings=np.concatenate(rows), meta=np.array(made_under))
    embeddings = np.concatenate(rows).astype(np.float32)                    # (N, D_img)
    image_ids = np.array([image_id for image_id, _ in photos], dtype=np.int64)  # (N,)
    meta.update(dtype="float32", count=len(embeddings), dim=embeddings.shape[1])
    savez(out, image_ids=image_ids, embeddings=embeddings,
          meta=np.array(json.dumps(meta, sort_keys=True, default=str)))
    partial.unlink(missing_ok=True)
    print(f"wrote {out}: {len(embeddings)} photos x {embeddings.shape[1]} float32, "
          f"{model_name} at revision {revision}, {POOLING}")
    print(f"{sha256_file(out)}  {out}")
