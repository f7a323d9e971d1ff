"""What a smaller cache costs (chapter 7): each lever at one setting, the sweep and its Pareto front, the
recall an eviction policy allows, and what the model does inside.
"""
