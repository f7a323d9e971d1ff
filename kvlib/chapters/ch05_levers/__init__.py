"""All the levers on one model (chapter 5): the lever chain, its budgets and simulated serving."""
