"""The first hints of chapter 7's exercises ("What a smaller cache costs"):
what ``check("7.k", ...)`` prints for
an exercise not answered yet (:func:`kvlib.exercises.feedback.first_hint`). :mod:`kvlib.exercises.ch7`
holds the checks and imports these.
"""

# What check("7.k", ...) says before the exercise is answered: a nudge, never the answer
FIRST_HINTS = {
    "7.1": (
        "count one key vector of 16 values first: its 4-bit codes, and what each group of 8 values stores "
        "beside them; then multiply by K and V, the KV heads and the layers"
    ),
    "7.2": (
        "split the 500 tokens into those already quantized (whole blocks of 128) and those still waiting "
        "in fp16, and price a token of each kind per KV head and layer"
    ),
    "7.3": (
        "query heads that read old heads 0 and 1 will read new head 0 (and 2 and 3, new head 1): a new "
        "head's row r is made from row r of the heads it replaces"
    ),
    "7.4": (
        "list the positions StreamingLLM holds when position 384 is read (its sinks and its most recent "
        "tokens), then keep those that belong to the register"
    ),
    "7.5": (
        "reshape the last dim into (groups, group_size), take each group's min and max with keepdim=True, "
        "and think about a group whose values are all equal"
    ),
}
