"""Date columns read as time: ``YYYYMMDD`` numbers as decimal years (``--data-option dates=``).

A kernel on time (a trend, a yearly period) wants one number per row on a uniform scale; a
date written ``YYYYMMDD`` is a number, but not such a scale: the last day of a year and the
first of the next lie 8,870 apart, two consecutive days in a month 1 apart.
:func:`decimal_years` maps each date to its year plus the fraction of that year elapsed at the
day's start (the second of July of a common year is the year plus one half).
"""

from __future__ import annotations

import datetime

import numpy as np

__all__ = ["decimal_years"]


def decimal_years(values: np.ndarray, *, where: str) -> np.ndarray:
    """``YYYYMMDD`` numbers as decimal years (float64).

    Args:
        values: the column, numbers.
        where: names the column in errors.

    Raises:
        ValueError: naming the first row (0-based) whose value is not a whole number or not a
            valid date.
    """
    out = np.empty(len(values), dtype=np.float64)
    cache: dict[int, float] = {}
    for i, value in enumerate(values):
        if value != np.floor(value):
            raise ValueError(f"{where}: row {i} (0-based) holds {value!r}, not a date written "
                             "YYYYMMDD")
        key = int(value)
        if key not in cache:
            try:
                day = datetime.date(key // 10000, key // 100 % 100, key % 100)
            except ValueError:
                raise ValueError(f"{where}: row {i} (0-based) holds {key}, not a valid date "
                                 "written YYYYMMDD") from None
            start = datetime.date(day.year, 1, 1)
            length = (datetime.date(day.year + 1, 1, 1) - start).days
            cache[key] = day.year + (day - start).days / length
        out[i] = cache[key]
    return out
