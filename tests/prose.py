"""The rule that keeps the book's prose from drifting from its outputs.

Every number the prose states about a run's results is pasted from the notebook that computed it,
``{glue:text}`key:.2f```; a published or fixed figure (a paper's table, a data sheet, a model's
config, a parameter of the experiment, an exercise's givens) is marked ``{fixed}`1,555 GB/s```
and its sentence names its source. :func:`typed_numbers` finds every other number in a piece of
MyST prose: tests/test_prose_numbers.py fails on any, in every page of both editions.

What is not prose, and so not read: code (inline and fenced), roles with their content (glue,
fixed, cite, doc, ref, term, ...), link targets and URLs, HTML, directive names and options.
Structural references are not results: "chapter 4", "Exercise 4.6", the paper's "Figure 13a",
"Section 6.1", a list's "1." and a numbered heading. Neither are digits inside a name (A100,
OPT-13B, GQA-4, fp16, 8B, 16-bit, L2, a GPU's
"A100 40 GB", a family's generation "Gemma 2", "PCIe 4.0", "NVLink 4").
Math is formulas: an integer in it is a constant of the formula or arithmetic on fixed figures,
but a decimal in math is refused (a measured or simulated value cannot be pasted into math:
write it in the prose, glued).
"""

from __future__ import annotations

import re

# a fence's opening line: ``` or ~~~ (at least three) and its info string; a code block is one whose
# info is a language or a code-like directive; ```{glossary}, ```{note} and the other prose
# directives keep their content
_FENCE_OPEN = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*)$")
_CODE_INFO = re.compile(
    r"^(?:\{(?:literalinclude|code-cell|code-block|code|math|raw|image|figure)\}.*|[\w+-]*)$"
)


def _blank_code_blocks(markdown: str) -> str:
    """``markdown`` with every fenced code block blanked (fences matched in order, as Markdown does)."""
    lines, fence, code = markdown.split("\n"), None, False
    for i, line in enumerate(lines):
        if fence is None:
            opened = _FENCE_OPEN.match(line)
            if opened:
                fence, code = opened.group("fence"), bool(_CODE_INFO.match(opened.group("info").strip()))
                if code:
                    lines[i] = " " * len(line)
        else:
            closing = line.strip()
            if closing and set(closing) == {fence[0]} and len(closing) >= len(fence):
                if code:
                    lines[i] = " " * len(line)
                fence, code = None, False
            elif code:
                lines[i] = " " * len(line)
    return "\n".join(lines)


# a fence and its directive (```{note}, :::{dropdown}); a title after it is prose and is read
_FENCE_LINE = re.compile(r"^[ \t]*(?:`{3,}|:{3,}|~{3,})(?:\{[\w:-]+\})?", re.MULTILINE)
_OPTION_LINE = re.compile(r"^[ \t]*:[\w-]+:.*$", re.MULTILINE)  # :class: tip, :pyobject: f
_ROLE = re.compile(r"\{[\w:+-]+\}(`+)(?P<content>.+?)\1", re.DOTALL)
_CODE = re.compile(r"(`+)(?P<content>.+?)\1", re.DOTALL)
_DISPLAY_MATH = re.compile(r"\$\$(?P<content>.+?)\$\$", re.DOTALL)
_INLINE_MATH = re.compile(r"\$(?P<content>[^$\n]+?)\$")
_LINK_TARGET = re.compile(
    r"\]\([^)]*\)|\]\[[^\]]*\]|^\[[^\]]+\]:.*$|<https?://[^>]+>|https?://\S+", re.MULTILINE
)
_HTML = re.compile(r"<!--.*?-->|</?[A-Za-z][^>]*>", re.DOTALL)
_LABEL = re.compile(r"^\([\w-]+\)=\s*$", re.MULTILINE)  # (my-label)=
# references to a part of this book or of a cited work
_STRUCTURE = re.compile(
    r"\b(?:[Cc]hapters?|[Ee]xercises?|[Ss]ections?|[Ff]igures?|[Tt]ables?|[Aa]lgorithms?|[Aa]ppendix|"
    r"[Ee]quations?|Eq\.|[Ll]istings?|[Pp]arts?)\s+\d+(?:\.\d+)*[a-z]?(?:\s*(?:[-–,]|and|or|to)\s*\d+(?:\.\d+)*[a-z]?)*"
    r"|第?\s*\d+(?:\s*[-–、,]\s*\d+)*\s*章|演習\s*\d+\.\d+(?:\s*[-–、]\s*\d+\.\d+)*|[図表]\s*\d+[a-z]?"
    r"|節\s*\d+(?:\.\d+)*|\d+(?:\.\d+)*\s*節"
    r"|^[ \t]*(?:#+[ \t]+)?\d+\.(?=[ \t])",  # an ordered list's markers, a numbered heading ("## 3. Sizing")
    re.MULTILINE,
)
# a GPU's product name carries its memory: "A100 40 GB", "H100 80GB"
# and a model family its generation: "Gemma 2", "Llama 3.1", "DeepSeek V3", "Python 3"
_PRODUCT = re.compile(
    r"(?<![A-Za-z0-9])(?:[AHBLV]\d{2,3}[A-Z]?|MI\d{3}[A-Z]?|RTX \d{4})"
    r"(?: (?:SXM|PCIe|NVL))? ?\d+ ?GB(?![A-Za-z])"
    r"|(?<![A-Za-z])(?:Gemma|Llama|Qwen|Mistral|Mixtral|Phi|GPT|DeepSeek|Jamba|Falcon|Python|CUDA|PCIe|NVLink|HBM)"
    r"[ -]v?\d+(?:\.\d+)?(?![\w.])"
)
# a number: digits with separators, not part of a name (a letter or "letter-" before it, a letter after)
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.])(?<![A-Za-z]-)\d+(?:[.,]\d+)*(?:-bit\b)?(?![.,]?\d)(?![A-Za-wyzA-Z_])"
)
_DECIMAL = re.compile(r"(?<![\w.{])\d*\.\d+")


def _blank(pattern: re.Pattern, text: str) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (line breaks kept)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def prose_only(markdown: str, structure: bool = False) -> str:
    """``markdown`` with everything that is not prose blanked out: code, roles, links, HTML,
    directive lines and math (see the module's docstring); structural references and names too
    unless ``structure``."""
    text = _blank_code_blocks(markdown)
    for pattern in (
        _FENCE_LINE,
        _OPTION_LINE,
        _DISPLAY_MATH,
        _ROLE,
        _CODE,
        _INLINE_MATH,
        _LINK_TARGET,
        _HTML,
    ):
        text = _blank(pattern, text)
    for pattern in (_LABEL,) if structure else (_LABEL, _STRUCTURE, _PRODUCT):
        text = _blank(pattern, text)
    return text


def _math_decimals(markdown: str) -> list[str]:
    text = _blank_code_blocks(markdown)
    for pattern in (_FENCE_LINE, _ROLE, _CODE):
        text = _blank(pattern, text)
    found = []
    for pattern in (_DISPLAY_MATH, _INLINE_MATH):
        for match in pattern.finditer(text):
            found += [
                f"${match.group('content').strip()}$: {d}" for d in _DECIMAL.findall(match.group("content"))
            ]
        text = _blank(pattern, text)
    return found


def typed_numbers(markdown: str) -> list[str]:
    """Each number of ``markdown``'s prose that is neither glued nor marked ``{fixed}``, with the
    words around it (and each decimal written in math)."""
    text = prose_only(markdown)
    found = []
    for match in _NUMBER.finditer(text):
        if match.group(0).endswith("-bit"):
            continue
        start, end = max(0, match.start() - 30), match.end() + 30
        context = re.sub(r"\s+", " ", text[start:end]).strip()
        found.append(f"{match.group(0)!r} in '...{context}...'")
    return found + [f"decimal in math {item}" for item in _math_decimals(markdown)]


_ROLE_OR_CODE = re.compile(r"(?P<role>\{[\w:+-]+\})(?P<a>`+).+?(?P=a)|(?P<b>`+).+?(?P=b)", re.DOTALL)
_GLUE = re.compile(r"\{glue(?::(?:text|md|any))?\}`(?P<content>[^`]+)`")


def pasted_keys(markdown: str) -> list[tuple[str, str]]:
    """The ``(document, key)`` pairs ``markdown`` pastes with glue roles: document is "" for the
    page's own notebook, else the path before ``::``."""
    keys = []
    # `{glue:text}` written about in inline code pastes nothing: blank code spans that are not roles
    markdown = _ROLE_OR_CODE.sub(lambda m: m.group(0) if m.group("role") else " " * len(m.group(0)), markdown)
    for match in _GLUE.finditer(markdown):
        content = match.group("content")
        document, _, rest = content.rpartition("::")
        key = rest.split(":", 1)[0] if ":" in rest else rest
        keys.append((document, key.strip()))
    return keys


# English number words, and the digits a translation writes for them ("three tools" -> "3 つの道具")
NUMBER_WORDS = {
    **{
        w: n
        for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
    },
    **{
        w: n
        for n, w in enumerate("_ first second third fourth fifth sixth seventh eighth ninth tenth".split())
        if n
    },
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "hundred": 100,
    "thousand": 1000,
    "million": 100,
    "once": 1,
    "twice": 2,
    "thrice": 3,
    "both": 2,
    "double": 2,
    "half": 2,
    "halves": 2,
    "thirds": 3,
    "quarter": 4,
    "quarters": 4,
    "dozen": 12,
    "single": 1,
    "hundredfold": 100,
    "tenfold": 10,
    "fourfold": 4,
    "threefold": 3,
    "twofold": 2,
    "eleventh": 11,
    "twelfth": 12,
    "sixteenth": 16,
    "sixteenths": 16,
    "twentieth": 20,
    "hundredth": 100,
    "thousandth": 1000,
    "eighths": 8,
    "tenths": 10,
    "fifths": 5,
    "fourths": 4,
}
_WORD = re.compile(r"[A-Za-z]+")


def added_numbers(english: str, translation: str) -> list[str]:
    """The numbers a translation's prose writes that its English does not: each digit of the
    translation must stand for a number word of the English ("three" -> 3) or a number the English
    prose has too. A translation cannot type a result its English pastes. The digit 1 is always
    allowed (a translation writes "1 つの" for an English "a")."""
    from collections import Counter

    english = prose_only(english, structure=True)  # "chapter 4", "Llama 3", "## 2." may be written anew
    words = [w.lower() for w in _WORD.findall(english)]
    words = [w if w in NUMBER_WORDS else w.removesuffix("fold") for w in words]  # "sixfold" -> six
    allowed = Counter(str(NUMBER_WORDS[w]) for w in words if w in NUMBER_WORDS)
    allowed.update(m.group(0).removesuffix("-bit") for m in _NUMBER.finditer(english))
    allowed.update(
        re.findall(r"(?<![\w.])(\d+)(?:st|nd|rd|th|-bit|-layer|-head|-token)\b", english)
    )  # "the 13th"
    found = (
        Counter(m.group(0).removesuffix("-bit") for m in _NUMBER.finditer(prose_only(translation))) - allowed
    )
    found.pop("1", None)
    return sorted(found.elements()) + [f"decimal in math {d}" for d in _math_decimals(translation)]
