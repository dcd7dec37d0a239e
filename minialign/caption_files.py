"""A captions file -> its (image_id, caption) rows in file order, for data.load_captions. The
suffix says the format; each is UTF-8 (a BOM is skipped), blank lines are skipped:
    .json   COCO's: {"annotations": [{"image_id": 139, "caption": "A dog runs."}, ...], ...}
    .jsonl  a caption a line: {"image_id": 139, "caption": "A dog runs."}
    .csv    a header naming the columns image_id and caption (others are ignored), then a
            caption a row: 139,"A dog, running." (in quotes if it has a comma or a quote)
A format error is a ValueError of one line, "path:line: what was expected" (COCO's JSON:
"path: annotations[k]: ..."), raised before anything is written."""
import csv
import io
import json


def read_rows(path):
    """[(image_id int, caption str with some text)] of the captions file `path`, a Path."""
    if path.suffix not in (".json", ".jsonl", ".csv"):
        raise ValueError(f"{path}: expected a captions file ending in .json (COCO), .jsonl or .csv")
    try:
        text = path.read_text(encoding="utf-8-sig")                   # utf-8-sig: skips a BOM
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: expected UTF-8 text ({err})") from None
    if path.suffix == ".csv":
        rows = csv_rows(path, text)
    elif path.suffix == ".jsonl":
        rows = [(f"{path}:{n}", parse_json(line, path, n))
                for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    else:
        coco = parse_json(text, path, 1)
        if not isinstance(coco, dict) or not isinstance(coco.get("annotations"), list):
            raise ValueError(f'{path}: expected COCO\'s {{"annotations": [{{"image_id": 139, '
                             f'"caption": "A dog runs."}}, ...]}}')
        rows = [(f"{path}: annotations[{k}]", row) for k, row in enumerate(coco["annotations"])]
    return [check_row(where, row) for where, row in rows]


def csv_rows(path, text):
    lines = csv.reader(io.StringIO(text), strict=True)      # strict: a quote must be closed
    try:
        header, rows = next(lines, []), []
        if "image_id" not in header or "caption" not in header:
            raise ValueError(f"{path}:1: expected a header naming the columns image_id and "
                             f"caption, got {','.join(header)!r}")
        for row in lines:
            if not any(cell.strip() for cell in row):
                continue                                              # a blank line
            if len(row) != len(header):
                hint = " (a caption with a comma goes in quotes)" if len(row) > len(header) else ""
                raise ValueError(f"{path}:{lines.line_num}: expected {len(header)} columns "
                                 f"({','.join(header)}), got {len(row)}{hint}")
            rows.append((f"{path}:{lines.line_num}", dict(zip(header, row))))
    except csv.Error as err:
        raise ValueError(f"{path}:{lines.line_num}: expected CSV ({err})") from None
    return rows


def parse_json(text, path, line):
    """json.loads(text), text being `path` from `line` on; or "path:line: expected JSON (...)"."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{line + err.lineno - 1}: expected JSON ({err.msg} at column "
                         f"{err.colno})") from None


def check_row(where, row):
    """(image_id, caption) of a row {"image_id": 139 or "139", "caption": "..."}, or ValueError."""
    if not isinstance(row, dict):
        raise ValueError(f'{where}: expected {{"image_id": 139, "caption": "A dog runs."}}, '
                         f'got {row!r:.60}')
    image_id, caption = row.get("image_id"), row.get("caption")
    if not str(image_id).strip().isdecimal():
        raise ValueError(f"{where}: expected an image_id of digits, got {image_id!r:.60}")
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError(f"{where}: expected a caption, got {caption!r:.60}")
    return int(image_id), caption
