"""Why decoding without a cache is slow (chapter 1): the article's experiment, the lockstep race, the race
against transformers, the concatenation trap, the cost model and the lean step's roofline.
"""
