"""BERT's uncased WordPiece vocabulary (--tokenizer wordpiece), fetched by `make data` beside
the captions: coco/bert-base-uncased-vocab.txt, the 30,522-line vocab.txt of Hugging Face's
google-bert/bert-base-uncased repository at a pinned commit, checked by its sha256 (a checked
copy is used as it is; a cut transfer resumes: download.download).
"""
from pathlib import Path

from .download import download, refuse_http

VOCAB_NAME = "bert-base-uncased-vocab.txt"     # under --root, beside the captions
VOCAB_REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"   # the repository's commit
VOCAB_URL = (f"https://huggingface.co/google-bert/bert-base-uncased/resolve/{VOCAB_REVISION}/"
             f"vocab.txt")
VOCAB_SIZE = 231_508                            # bytes
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


def get_vocab(root="coco", url=VOCAB_URL, allow_http=False, size=None, sha256=None,
              progress=None):
    """root/VOCAB_NAME, downloaded from url unless a copy of the expected size and sha256 is
    there already. size, sha256: what the file must be (default VOCAB_SIZE, VOCAB_SHA256; tests
    serve a smaller one). Raises ValueError (plain http:// without allow_http; a download of
    other bytes, removed: one line naming the url) or download.DownloadError."""
    refuse_http("--vocab-url", url, allow_http)
    return download(url, Path(root) / VOCAB_NAME, expected_size=size or VOCAB_SIZE,
                    expected_sha256=sha256 or VOCAB_SHA256, progress=progress)
