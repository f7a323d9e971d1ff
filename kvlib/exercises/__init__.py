"""Checks for the exercises at the end of every chapter: what the chapters' checks share.

Each chapter's exercises live with the chapter (``kvlib.chapters.chNN_slug.exercises``, listed by
:mod:`kvlib.chapters.exercises`), with, for exercise ``N.k``:

- ``check_N_k(answer) -> str | None``: ``None`` when the answer is right, else a hint that
  names the likely mistake (not just "wrong");
- ``solve_N_k()``: the reference solution, shown in the chapter's "Worked solution"
  dropdown with ``literalinclude`` and proven by ``assert_solvable("N.k")`` in a cell the reader
  does not see (tagged ``remove-cell``), so every build proves each exercise is solvable without
  the answer being one import away from the reader's blank. Unit tests feed wrong answers (each
  module's ``WRONG_ANSWERS``) to prove each check can fail.

Readers call ``check("N.k", answer)`` with their own answer; each chapter shows the exercise with
a blank, ``answer = ...``, for which the check gives the first hint (``FIRST_HINTS`` of the
chapter's module) instead of a verdict. ``feedback`` holds :class:`Feedback` and
:func:`numeric_answer`, :func:`as_number` and :func:`returned_hint`, the helpers the chapters'
checks share.
"""
