"""`grader report`'s scores.png: one panel per lab in a grid three wide, 1200 px across, each
lab's maximum marked, so that nine labs read on a laptop's screen (a single row of nine was
4320 x 360 px). Drawn from a score table as `grader.report.score_table` returns it; the CSV and
the gradebook behind it are tested with real gradings in test_grader.py."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest

from grader.report import plot
from lib_dist.extend import LABS

MARK = np.array([0xC4, 0x4E, 0x52]) / 255  # the colour of the maximum's line and label


def table_of(labs: list[str], maxima: dict[str, float]) -> dict:
    scores = {f"student{i}": {lab: (i * 3) % (int(maxima[lab]) + 1) for lab in labs}
              for i in range(12)}
    scores["late"] = {lab: None for lab in labs}  # submitted nothing: in no histogram
    return scores | {"(max)": maxima}


def marked_panels(path, rows: int, columns: int) -> list[bool]:
    """For each cell of the grid, row by row: does it show the maximum's colour?"""
    pixels = matplotlib.image.imread(path)[..., :3]
    marked = (np.abs(pixels - MARK) < 0.04).all(axis=-1)
    h, w = marked.shape[0] // rows, marked.shape[1] // columns
    return [bool(marked[r * h:(r + 1) * h, c * w:(c + 1) * w].any())
            for r in range(rows) for c in range(columns)]


@pytest.mark.parametrize("count, grid", [(9, (3, 3)), (4, (2, 3)), (2, (1, 2)), (1, (1, 1))])
def test_one_panel_per_lab_three_to_a_row_each_maximum_marked(tmp_path, count, grid):
    labs = sorted(LABS)[:count]
    path = tmp_path / "scores.png"
    maxima = {lab: float(5 + i) for i, lab in enumerate(labs)}
    assert plot(labs, table_of(labs, maxima), path) == grid
    height, width, _ = matplotlib.image.imread(path).shape
    assert width == 1200
    assert height == 312 * grid[0]  # rows of 312 px: three rows fit a laptop's screen
    # every lab's panel marks its maximum; the cells left over in the last row are blank
    assert marked_panels(path, *grid) == [i < count for i in range(grid[0] * grid[1])]
