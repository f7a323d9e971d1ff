"""Checks for the exercises at the end of every chapter (0 to 5, 7 and 8).

Each chapter has a module ``kvlib.exercises.chN`` with, for exercise ``N.k``:

- ``check_N_k(answer) -> str | None``: ``None`` when the answer is right, else a hint that
  names the likely mistake (not just "wrong");
- ``solve_N_k()``: the reference solution, shown in the chapter's "Worked solution"
  dropdown with ``literalinclude`` and fed to :func:`check` by the notebook, so every build
  proves each exercise is solvable. Unit tests feed wrong answers (each module's
  ``WRONG_ANSWERS``) to prove each check can fail.

Readers call ``check("N.k", answer)`` with their own answer; each chapter shows the exercise with
a blank, ``answer = ...``, for which the check gives the first hint (``FIRST_HINTS`` of the
chapter's module) instead of a verdict; the notebook proves the reference solution in a cell
the reader does not see (tagged ``remove-cell``). ``feedback`` holds
:func:`check`, :func:`solution`, :class:`Feedback`, and :func:`numeric_answer`,
:func:`as_number` and :func:`returned_hint`, the helpers the chapters' checks share.
"""
