"""`save_every_minutes: auto`: how often to save when a session can be cut without warning.

A known limit (Kaggle's 12 h, a time budget) needs no cadence: the deadline stop saves just
before it. What a cadence buys is protection from the cut nobody announces (a preemption, a
crash, a kill -9): saving every T minutes costs C (save + upload, measured) T-th of the time and
loses T/2 on average per cut. With a cut every M hours on average, the total is least at
T = sqrt(2·C·M) (Young's interval). T is kept between the Hub's commit budget allows and 30 min.

Example:
    >>> round(interval_s(save_cost_s=20, cut_every_s=4 * 3600) / 60, 1)
    12.6
"""

from __future__ import annotations

import math

CUT_EVERY_S = 4 * 3600.0  # assumed mean time between unannounced cuts: nobody publishes one
FLOOR_S = 60.0
CEILING_S = 30 * 60.0


def interval_s(save_cost_s: float, cut_every_s: float = CUT_EVERY_S, floor_s: float = FLOOR_S,
               ceiling_s: float = CEILING_S) -> float:
    """Young's interval sqrt(2·C·M), within [floor_s, ceiling_s]; the ceiling before C is measured."""
    if not save_cost_s or save_cost_s <= 0:
        return ceiling_s
    return min(ceiling_s, max(floor_s, math.sqrt(2 * save_cost_s * cut_every_s)))


def words(every_s: float, save_cost_s: float, cut_every_s: float = CUT_EVERY_S) -> str:
    """`save every 12.6 min: a save + upload takes 20 s (2.6 % of the time); a cut without warning …`."""
    return (f"save_every_minutes auto: every {every_s / 60:.1f} min — a save + upload takes {save_cost_s:.3g} s "
            f"({100 * save_cost_s / every_s:.1f} % of the time); a cut without warning loses "
            f"{every_s / 120:.1f} min on average (assuming one every {cut_every_s / 3600:g} h); the session's "
            "deadline saves anyway")
