"""`python -m minialign ablations` (machinery/grid/ablations.py): each unsaid choice flipped
alone, one table. The cell's change and its within/beyond-the-spread verdict on hand-made
numbers; the command on a tiny world: the table's shape, "= default" where a choice does not
apply, the real captions' columns, and a rerun that trains nothing and writes the same table."""
import json

import numpy as np
import pytest

from minialign.__main__ import main
from minialign.machinery.grid import ablations
from minialign.machinery.images.synthetic import CAPTIONS_NAME, EMBEDDINGS_NAME, write_world


def test_change_cell_on_hand_made_numbers():
    default = [0.10, 0.12, 0.14]                                # mean 0.12, std 0.02
    assert ablations.default_cell(default) == "0.120 ± 0.020"
    # +0.03 against a spread of 0.02 (both rows): beyond
    assert ablations.change_cell(default, [0.13, 0.15, 0.17]) == \
        "0.150 (+0.030, beyond spread 0.020)"
    # -0.01: within
    assert ablations.change_cell(default, [0.09, 0.11, 0.13]) == \
        "0.110 (-0.010, within spread 0.020)"
    # the larger spread of the two rows decides: +0.03 within a spread of 0.04
    assert ablations.change_cell(default, [0.11, 0.15, 0.19]) == \
        "0.150 (+0.030, within spread 0.040)"
    assert ablations.change_cell([0.2], [0.25]) == "0.250 (+0.050, 1 seed)"
    assert ablations.change_cell(default, []) == "-" and ablations.default_cell([]) == "-"


def test_variants_flip_one_choice_over_the_objectives_it_changes():
    from minialign.machinery.experiment.protocol import Protocol
    from minialign.train import TrainConfig
    found = ablations.variants(Protocol(base=TrainConfig(), seeds=(0,)))
    assert list(found) == ["default", "projector", "last-token", "drop-words", "freeze-unseen"]
    assert found["projector"].base.model.projector_dim == 4 * 256
    assert found["last-token"].objectives == ("next_token",)
    assert found["last-token"].base.model.causal_pool == "last"
    assert found["drop-words"].objectives == ("bad_views",)
    assert found["freeze-unseen"].base.loss.unseen_params == "freeze"
    assert all(p.lr_per_decade == 0 for p in found.values())


@pytest.fixture()
def world(tmp_path):
    write_world(tmp_path / "world", n_scenes=60, seed=0)
    return tmp_path / "world"


def ablate(world, out, text=None):
    return main(["ablations", "--captions", str(world / CAPTIONS_NAME),
                 "--embeddings", str(world / EMBEDDINGS_NAME), "--out", str(out),
                 "--steps", "2", "--batch-photos", "8", "--warmup-steps", "1",
                 "--eval-every", "2", "--d-model", "8", "--n-layers", "1", "--n-heads", "2",
                 "--seeds", "0", "1", "--jobs", "1", "--threads", "1",
                 *(["--text-captions", str(text)] if text else [])])


def test_the_command_writes_one_table_and_a_rerun_trains_nothing(world, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setattr(ablations, "TEXT", {**ablations.TEXT, "steps": 2, "batch_photos": 8,
                                            "warmup_steps": 1, "eval_every": 2})
    monkeypatch.setattr(ablations, "TEXT_MODEL", {"d_model": 8, "n_layers": 1, "n_heads": 2})
    out = tmp_path / "ablations"
    assert ablate(world, out, text=world / CAPTIONS_NAME) == 0
    table = (out / "ablations.md").read_text().strip().split("\n")
    assert len(table) == 2 + 5                                  # header, rule, 5 rows
    cells = [row.strip("| ").split(" | ") for row in table[:1] + table[2:]]
    assert all(len(row) == 1 + 9 + 3 for row in cells)          # 3 x 3 demo + 3 real-caption
    assert table[1].count("|") == 1 + 9 + 3 + 1
    rows = {row[0]: row[1:] for row in cells[1:]}
    label = {c.name: c.label for c in ablations.CHOICES}
    assert rows[label["last-token"]][:6] == ["= default"] * 6   # good and bad views untouched
    assert rows[label["drop-words"]][6:9] == ["= default"] * 3
    assert "spread" in rows[label["projector"]][0]
    numbers = json.loads((out / "ablations.json").read_text())
    assert len(numbers["demo"]["default"]["good_views"]["mutual_knn"]) == 2       # two seeds
    assert len(numbers["text"]["default"]["next_token"]["paraphrase_R@1"]) == 1   # one seed
    value = np.mean(numbers["demo"]["default"]["bad_views"]["R@1"])
    assert rows["default (today's)"][4].startswith(f"{value:.3f} ± ")
    first = (out / "ablations.md").read_bytes()
    capsys.readouterr()
    assert ablate(world, out, text=world / CAPTIONS_NAME) == 0  # the rerun
    printed = capsys.readouterr().out
    # runs per variant (default, projector, last-token, drop-words, freeze-unseen): demo x 2
    # seeds, real captions x 1
    per_variant = 3 + 3 + 1 + 1 + 2
    assert printed.count("finished earlier, skipped") == 2 * per_variant + per_variant
    assert "step 1/" not in printed                             # nothing trained
    assert (out / "ablations.md").read_bytes() == first


def test_without_real_captions_their_columns_are_skipped_in_one_line(world, tmp_path, capsys):
    out = tmp_path / "ablations"
    assert ablate(world, out, text=tmp_path / "absent.json") == 0
    printed = capsys.readouterr().out
    assert sum("no real captions" in line for line in printed.split("\n")) == 1
    assert len((out / "ablations.md").read_text().split("\n")[0].strip("| ").split(" | ")) == 1 + 9
