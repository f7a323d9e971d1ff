"""The translated editions of kvbook: their configuration and the state of their catalogues.

The Japanese edition (日本語版) is the English sources translated, the Sphinx way: the gettext
builder extracts every message of every page into ``_build/i18n/_build/gettext/<page>.pot`` (one
catalogue per page, so translators can work on pages in parallel: see kvbook_sphinx's
``gettext_compact``), ``sphinx-intl update`` merges them into ``locales/ja/LC_MESSAGES/<page>.po``,
translators fill in the ``msgstr`` lines, and the Japanese build renders each page with them.
``make translations`` runs those steps and then this module's ``status``.

A Sphinx project sets its language in its configuration, before any extension runs (Sphinx loads
its own labels and the theme's in that language when it starts), so the Japanese build gets a
configuration of its own: ``edition_config`` writes a copy of ``_config.yml`` (under ``_build/``,
never committed) with ``language: ja`` and the book's title and author taken from the catalogue
``_config.po``, whose messages ``write_config_pot`` extracts from ``_config.yml``.

Command line (the Makefile's ``translations`` and ``book-ja`` targets use it)::

    python -m kvbook_sphinx.i18n pot DIR                # write DIR/_config.pot
    python -m kvbook_sphinx.i18n config LANG OUT        # write LANG's edition config to OUT
    python -m kvbook_sphinx.i18n status LANG            # untranslated and fuzzy messages per catalogue
    python -m kvbook_sphinx.i18n only DIR PAGE...       # keep only these pages' .pot files in DIR
    python -m kvbook_sphinx.i18n todo LANG PAGE         # PAGE's messages left to translate
    python -m kvbook_sphinx.i18n apply LANG PAGE FILE   # write FILE's translations (JSON) into PAGE's .po
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
LOCALES = "locales"  # Sphinx's default locale_dirs, relative to the book's root
CONFIG_CATALOGUE = "_config"  # locales/<lang>/LC_MESSAGES/_config.po: the messages of _config.yml
CONFIG_MESSAGES = ("title", "author")  # the top-level keys of _config.yml that a reader sees
# the file (or folder) under the English edition's root where each language's edition lives
EDITIONS = {"en": "", "ja": "ja/"}
IN_PROGRESS = ".translation-in-progress"  # locales/<lang>/.translation-in-progress: still translating


def catalogue_dir(language: str, root: Path = ROOT) -> Path:
    """``locales/<language>/LC_MESSAGES``: where ``language``'s .po files live."""
    return root / LOCALES / language / "LC_MESSAGES"


def toc_captions(root: Path = ROOT) -> list[str]:
    """The captions of ``_toc.yml``'s parts ("Chapters", "Reference"): the sidebar shows them."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    return [part["caption"] for part in toc.get("parts", []) if part.get("caption")]


def write_config_pot(pot_dir: Path, root: Path = ROOT) -> Path:
    """Write ``pot_dir/_config.pot``: the book's title and author and the table of contents'
    captions, which Sphinx does not extract."""
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    catalog = Catalog(project=config.get("title", ""), fuzzy=False)
    for key in CONFIG_MESSAGES:
        if config.get(key):
            catalog.add(str(config[key]), locations=[("_config.yml", 0)], auto_comments=[key])
    for caption in toc_captions(root):
        catalog.add(caption, locations=[("_toc.yml", 0)], auto_comments=["caption"])
    pot_dir.mkdir(parents=True, exist_ok=True)
    path = pot_dir / f"{CONFIG_CATALOGUE}.pot"
    with path.open("wb") as out:
        write_po(out, catalog, omit_header=False, include_lineno=False)
    return path


def read_catalogue(path: Path, language: str):
    """The babel Catalog of one .po file."""
    with path.open("rb") as po:
        return read_po(po, locale=language)


def translate(text: str, catalogue) -> str:
    """``text`` translated by ``catalogue`` (a babel Catalog), or ``text`` itself when untranslated."""
    message = catalogue.get(text) if catalogue is not None else None
    if message is None or not message.string or message.fuzzy:
        return text
    return message.string


def edition_config(language: str, out: Path, root: Path = ROOT) -> dict:
    """Write the configuration of ``language``'s edition: ``_config.yml`` with Sphinx's ``language``
    set and the title and author translated (untranslated ones stay English), and beside it
    ``_toc.yml`` with the parts' captions translated. Returns the configuration."""
    if language not in EDITIONS:
        raise SystemExit(f"kvbook: no {language!r} edition; the editions are {', '.join(EDITIONS)}")
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    po = catalogue_dir(language, root) / f"{CONFIG_CATALOGUE}.po"
    catalogue = read_catalogue(po, language) if po.is_file() else None
    for key in CONFIG_MESSAGES:
        if config.get(key):
            config[key] = translate(str(config[key]), catalogue)
    sphinx_config = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx_config["language"] = language
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Generated by `python -m kvbook_sphinx.i18n config {language}` from _config.yml: do not edit.\n"
    )
    out.write_text(header + yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    for part in toc.get("parts", []):
        if part.get("caption"):
            part["caption"] = translate(part["caption"], catalogue)
    (out.parent / "_toc.yml").write_text(
        header + yaml.safe_dump(toc, allow_unicode=True, sort_keys=False), encoding="utf-8"
    )
    return config


@dataclass(frozen=True)
class CatalogueState:
    """The messages of one catalogue: how many there are, and how many still need a translator."""

    path: str  # relative to locales/<lang>/LC_MESSAGES/, e.g. book/02_cache_size.po
    messages: int
    untranslated: int
    fuzzy: int

    @property
    def done(self) -> bool:
        """Nothing left for a translator: no untranslated and no fuzzy message."""
        return self.untranslated == 0 and self.fuzzy == 0


def catalogue_states(language: str, root: Path = ROOT) -> list[CatalogueState]:
    """Every catalogue of ``language``, in path order (obsolete ``#~`` entries are not counted)."""
    folder = catalogue_dir(language, root)
    states = []
    for path in sorted(folder.rglob("*.po")):
        catalogue = read_catalogue(path, language)
        messages = [m for m in catalogue if m.id]  # the header has an empty id
        states.append(
            CatalogueState(
                path=path.relative_to(folder).as_posix(),
                messages=len(messages),
                untranslated=sum(1 for m in messages if not m.string),
                fuzzy=sum(1 for m in messages if m.string and m.fuzzy),
            )
        )
    return states


def status_report(language: str, root: Path = ROOT) -> str:
    """A table: per catalogue its messages, untranslated and fuzzy ones; then the totals."""
    states = catalogue_states(language, root)
    if not states:
        return f"no catalogues under {catalogue_dir(language, root)}: run `make translations`"
    width = max(len(s.path) for s in states)
    lines = [f"{'catalogue (' + language + ')':<{width}}  messages  untranslated  fuzzy"]
    for s in states:
        mark = "" if s.done else "  <- to translate"
        lines.append(f"{s.path:<{width}}  {s.messages:>8}  {s.untranslated:>12}  {s.fuzzy:>5}{mark}")
    total = [sum(getattr(s, f) for s in states) for f in ("messages", "untranslated", "fuzzy")]
    lines.append(f"{'total':<{width}}  {total[0]:>8}  {total[1]:>12}  {total[2]:>5}")
    todo = [s for s in states if not s.done]
    lines.append(
        f"{len(todo)} of {len(states)} catalogues need translating (fill in msgstr, remove '#, fuzzy')"
        if todo
        else "every message is translated"
    )
    return "\n".join(lines)


# What a translation must carry over unchanged (MyST source, as the messages are): inline code,
# math, roles with their targets, link targets and URLs; and every number of the prose.
_CODE = re.compile(r"(\{[\w:+-]+\})?(`+)(.+?)\2")  # {role}`content` or `code`
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\s](?:[^$]*[^$\s])?\$", re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)|<(https?://[^>]+)>|(https?://[^\s)>]+)")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# a glued key's Japanese twin (verdict_ja for verdict, with or without a format after the colon)
_JAPANESE_TWIN = re.compile(r"^([^:]+?)_ja(?=:|$)")
# roles whose text a translator may translate (the glossary answers to the Japanese term too)
TRANSLATABLE_ROLES = {"{term}"}


def _keep(text: str) -> tuple[Counter, str]:
    """The pieces of ``text`` a translation must keep, and the prose left without them."""
    kept: Counter = Counter()

    def code(match: re.Match) -> str:
        role, content = match.group(1), match.group(3)
        if role in TRANSLATABLE_ROLES:
            kept[role] += 1
        elif role == "{glue:text}":
            # a verdict in words is glued in both languages (kvlib.glue): key_ja stands for key
            kept[f"{role}`{_JAPANESE_TWIN.sub(lambda m: m.group(1), content)}`"] += 1
        elif role:
            target = re.search(r"<([^<>]+)>\s*$", content)  # {ref}`text <target>`: the text may change
            kept[f"{role}`{target.group(1) if target else content}`"] += 1
        else:
            kept[f"`{content}`"] += 1
        return " "

    prose = _CODE.sub(code, text)
    for pattern in (_MATH, _LINK):
        kept.update(
            m.group(0) if pattern is _MATH else next(g for g in m.groups() if g)
            for m in pattern.finditer(prose)
        )
        prose = pattern.sub(" ", prose)
    return kept, prose


def message_problems(msgid: str, msgstr: str) -> list[str]:
    """What a translation loses of its message: code, math, roles, links (kept exactly, in any
    order) and numbers (each must still appear). Empty when ``msgstr`` is untranslated or fine."""
    if not msgstr:
        return []
    source, source_prose = _keep(msgid)
    target, target_prose = _keep(msgstr)
    problems = [f"lost {piece!r}" for piece in sorted(source - target)]
    problems += [f"added {piece!r}" for piece in sorted(target - source)]
    numbers = Counter(_NUMBER.findall(source_prose)) - Counter(_NUMBER.findall(target_prose))
    problems += [f"lost the number {number}" for number in sorted(numbers)]
    return problems


def keep_only(pot_dir: Path, pages: list[str]) -> list[str]:
    """Delete every ``.pot`` under ``pot_dir`` but those of ``pages`` (``book/04_serving``, with or
    without a suffix), so that ``sphinx-intl update`` touches only their catalogues. Returns the
    pages kept; a page without a .pot is an error."""
    wanted = {str(Path(page).with_suffix("")) for page in pages}
    present = {pot.relative_to(pot_dir).with_suffix("").as_posix(): pot for pot in pot_dir.rglob("*.pot")}
    missing = sorted(wanted - present.keys())
    if missing:
        raise SystemExit(f"kvbook: no messages extracted for {', '.join(missing)} (a page of _toc.yml?)")
    for name, pot in present.items():
        if name not in wanted:
            pot.unlink()
    return sorted(wanted)


def todo_report(language: str, page: str, root: Path = ROOT) -> str:
    """The messages of ``page``'s catalogue left to translate: each untranslated or fuzzy one
    with its English and, for a fuzzy one, the translation of its older English."""
    path = catalogue_dir(language, root) / f"{Path(page).with_suffix('')}.po"
    if not path.is_file():
        raise SystemExit(f"kvbook: no catalogue {path.relative_to(root)}: run `make translations`")
    lines = []
    for message in read_catalogue(path, language):
        if message.id and (not message.string or message.fuzzy):
            lines.append(f"=== {'fuzzy' if message.fuzzy and message.string else 'new'}")
            lines.append(f"msgid: {message.id}")
            if message.string:
                lines.append(f"older: {message.string}")
    return "\n".join(lines) or f"{path.relative_to(root)}: every message is translated"


def apply_translations(language: str, page: str, translations: dict[str, str], root: Path = ROOT) -> int:
    """Write ``translations`` (English message -> translation) into ``page``'s catalogue and clear
    their fuzzy marks. Refuses, before writing anything, a message the catalogue does not hold
    and a translation that loses what must stay (:func:`message_problems`). Returns the count."""
    path = catalogue_dir(language, root) / f"{Path(page).with_suffix('')}.po"
    catalogue = read_catalogue(path, language)
    problems = []
    for msgid, msgstr in translations.items():
        message = catalogue.get(msgid)
        if message is None:
            problems.append(f"not a message of {path.name}: {msgid[:70]!r}")
        elif message_problems(msgid, msgstr):
            problems.append(f"{msgid[:50]!r}: {message_problems(msgid, msgstr)}")
    if problems:
        raise SystemExit("kvbook: nothing written:\n  " + "\n  ".join(problems))
    for msgid, msgstr in translations.items():
        message = catalogue.get(msgid)
        message.string = msgstr
        message.flags.discard("fuzzy")
        message.previous_id = []
    with path.open("wb") as out:
        write_po(out, catalogue)  # as sphinx-intl writes it (76 columns), so that updates diff cleanly
    return len(translations)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m kvbook_sphinx.i18n", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pot = commands.add_parser("pot", help="write DIR/_config.pot (the messages of _config.yml)")
    pot.add_argument("dir", type=Path)
    config = commands.add_parser("config", help="write the configuration of LANG's edition to OUT")
    config.add_argument("language")
    config.add_argument("out", type=Path)
    only = commands.add_parser("only", help="keep only these pages' .pot files in DIR (PAGES=...)")
    only.add_argument("dir", type=Path)
    only.add_argument("pages", nargs="+")
    todo = commands.add_parser("todo", help="PAGE's untranslated and fuzzy messages, with older translations")
    todo.add_argument("language")
    todo.add_argument("page")
    apply = commands.add_parser("apply", help="write translations (a JSON object: English -> translation)")
    apply.add_argument("language")
    apply.add_argument("page")
    apply.add_argument("json", type=Path)
    status = commands.add_parser("status", help="untranslated and fuzzy messages per catalogue")
    status.add_argument("language")
    args = parser.parse_args(argv)
    if args.command == "pot":
        print(f"wrote {write_config_pot(args.dir)}")
    elif args.command == "todo":
        print(todo_report(args.language, args.page))
    elif args.command == "apply":
        import json

        translations = json.loads(args.json.read_text(encoding="utf-8"))
        print(f"wrote {apply_translations(args.language, args.page, translations)} translations")
    elif args.command == "only":
        kept = keep_only(args.dir, args.pages)
        print(f"updating the catalogues of {', '.join(kept)} only")
    elif args.command == "config":
        edition_config(args.language, args.out)
        print(f"wrote {args.out} (language: {args.language})")
    else:
        print(status_report(args.language))
    return 0


if __name__ == "__main__":
    sys.exit(main())
