"""The first hints of chapter 8's exercises ("Serving as engines do it now"):
what ``check("8.k", ...)`` prints for
an exercise not answered yet (:func:`kvlib.exercises.feedback.first_hint`). :mod:`kvlib.exercises.ch8`
holds the checks and imports these.
"""

# What check("8.k", ...) says before the exercise is answered: a nudge, never the answer
FIRST_HINTS = {
    "8.1": (
        "TTFT is the wait from the request's arrival to its first token; TPOT is the mean gap between "
        "the output tokens after that. A request meets an SLO only if it meets every target"
    ),
    "8.2": (
        "each step the running decodes take their tokens of the budget first, and the prompt gets what is "
        "left: count how many such chunks the prompt needs, and remember that a step is whole"
    ),
    "8.3": (
        "a pass yields one token more than the drafts accepted before the first rejection, and a draft "
        "counts only if every draft before it was accepted too"
    ),
    "8.4": (
        "the cache holds K and V of the KV heads, not of the query heads: share those heads over the GPUs, "
        "and ask what happens when there are more GPUs than KV heads"
    ),
    "8.5": (
        "one token's K/V is 2 (K and V) x layers x KV heads x head_dim x bytes per value; then mind the "
        "link's unit: Gb/s counts bits"
    ),
}
