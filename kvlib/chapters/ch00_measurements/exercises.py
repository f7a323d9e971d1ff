"""Exercises of chapter 0 (how to read the measurements): the median of noisy samples, the
bandwidth floor of reading a cache, and the book's rule for comparing two timings.

Each ``check_0_k`` computes the expected value with the same rule the book's code uses
(``statistics.median`` as in :func:`kvlib.measure.time_it`, the fastest repeats as in the
chapter's ratio) and recognises the usual mistakes by the numbers they produce.
"""

from __future__ import annotations

import statistics

from kvlib.exercises.feedback import numeric_answer, returned_hint
from kvlib.units import GiB

# ---- 0.1 a median

SAMPLES_MS = (10.2, 10.0, 10.1, 31.5, 10.3)  # five repeats; the fourth was interrupted by another program


def solve_0_1() -> float:
    """Sort the five samples and take the middle one: 10.0, 10.1, 10.2, 10.3, 31.5."""
    return statistics.median([10.2, 10.0, 10.1, 31.5, 10.3])


def check_0_1(answer):
    """Exercise 0.1: the median of the five samples (statistics.median, as time_it takes it).

    None if right, else a hint that names the likely mistake.
    """
    samples = list(SAMPLES_MS)
    return numeric_answer(
        answer,
        statistics.median(samples),
        {
            statistics.mean(samples): (
                "that is the mean: the one interrupted sample drags it up; the timer reports the middle "
                "sample"
            ),
            min(samples): (
                "that is the fastest sample, which the chapter divides for ratios; the timer's headline is "
                "the median"
            ),
            max(samples): (
                "that is the slowest sample, the interrupted one; the median is the middle of the sorted "
                "samples"
            ),
            samples[
                2
            ]: "that is the third sample as listed; sort the samples first, then take the middle one",
        },
        rel=1e-6,
        what="the middle value of the sorted samples",
    )


# ---- 0.2 the bandwidth floor

CACHE_GIB, BANDWIDTH_GBPS = 2, 1555  # a 2 GiB KV cache; an A100 40 GB's memory bandwidth (GB/s = 1e9 bytes/s)


def solve_0_2() -> float:
    """Bytes over bytes per second, in milliseconds; a GiB is 2**30 bytes, a GB/s 1e9 bytes per second."""
    return 2 * 2**30 / (1555 * 1e9) * 1e3


def check_0_2(answer):
    """Exercise 0.2: the least time to read the cache once at the given bandwidth, in ms.

    None if right, else a hint that names the likely mistake.
    """
    num_bytes, rate = CACHE_GIB * GiB, BANDWIDTH_GBPS * 1e9
    return numeric_answer(
        answer,
        num_bytes / rate * 1e3,
        {
            CACHE_GIB
            * 1e9
            / rate
            * 1e3: "a GiB is 2**30 bytes, not 1e9: the cache is 7% larger than 2e9 bytes",
            num_bytes / rate: "that is in seconds; the question asks for milliseconds",
            num_bytes / rate * 1e6: "that is in microseconds; the question asks for milliseconds",
            BANDWIDTH_GBPS / CACHE_GIB: (
                "that is bandwidth over size (how many times per second it could be read); time "
                "is size over bandwidth"
            ),
        },
        rel=2e-3,
        what="bytes divided by bytes per second",
    )


# ---- 0.3 comparing two timings


def solve_0_3():
    """The chapter's rule: divide the fastest samples (noise only ever adds time)."""

    def speed_ratio(slow_samples, fast_samples):
        return min(slow_samples) / min(fast_samples)

    return speed_ratio


_CASES = (  # (slow samples, fast samples): medians, means and minima all give different ratios
    ([4.0, 4.4, 12.0, 4.2, 4.1], [1.0, 3.5, 1.1, 1.2, 1.05]),
    ([3.0, 3.3, 3.2], [2.9, 6.0, 3.1]),
)


def check_0_3(answer):
    """Exercise 0.3: a reader's speed_ratio function, fed noisy sample pairs, against the book's rule.

    None if right, else a hint that names the likely mistake.
    """
    if not callable(answer):
        return f"answer with a function speed_ratio(slow_samples, fast_samples), not {type(answer).__name__}"
    for slow, fast in _CASES:
        try:
            got = answer(list(slow), list(fast))
        except Exception as error:  # the reader's code: report what went wrong, in one line
            return f"your function raised {type(error).__name__}: {error}"
        if returned_hint(got, "a ratio"):
            return returned_hint(got, "a ratio")
        hint = numeric_answer(
            got,
            min(slow) / min(fast),
            {
                statistics.median(slow)
                / statistics.median(
                    fast
                ): "that divides the medians; for a ratio the chapter divides the fastest samples",
                statistics.mean(slow)
                / statistics.mean(
                    fast
                ): "that divides the means, which stray slow samples distort; divide the fastest samples",
                min(fast)
                / min(slow): "upside down: how many times slower is the slow one, so slow over fast",
            },
            rel=1e-6,
            what="the fastest slow sample over the fastest fast sample",
        )
        if hint:
            return f"for samples {slow} and {fast}: {hint}"
    return None


def _median_ratio(slow, fast):
    return statistics.median(slow) / statistics.median(fast)


def _mean_ratio(slow, fast):
    return statistics.mean(slow) / statistics.mean(fast)


def _inverted(slow, fast):
    return min(fast) / min(slow)


def _raises(slow, fast):
    return slow / fast


WRONG_ANSWERS = {
    "0.1": [14.42, 10.0, 31.5, 10.1, "10.2"],
    "0.2": [1.2862, 0.0013811, 1381.1, 777.5, 2.0],
    "0.3": [_median_ratio, _mean_ratio, _inverted, _raises, 4.0],
}

# ---- what check(key, ...) says before the reader has answered: a nudge, not the answer

FIRST_HINTS = {
    "0.1": (
        "Sort the five samples first. Which statistic does the book's timer report, and how far can one "
        "interrupted sample move it?"
    ),
    "0.2": (
        "Time is bytes divided by bytes per second. Write both in plain units first: a GiB is 2**30 bytes, "
        "1 GB/s is 1e9 bytes per second; then convert the seconds to milliseconds."
    ),
    "0.3": (
        "Re-read the chapter's rule for comparing two amounts of work (after the first timing cell): which "
        "sample of each list does it divide, and why that one?"
    ),
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "0.1": (check_0_1, solve_0_1),
    "0.2": (check_0_2, solve_0_2),
    "0.3": (check_0_3, solve_0_3),
}
