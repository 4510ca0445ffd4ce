"""What the tests check in the tutorial's text: the numbers it quotes, never its wording.

A test finds the part of a file that quotes a result (a section, by its heading) and checks that each number
it computes from the result's file is among the numbers written there:

    text = quotes.section("docs/05-scaling-model.md", "The model against the published points")
    quotes.assert_quoted(text, f"{report['share']:.1f}", f"{report['ms']:.2f}")

Rewording a sentence passes; a number that no longer matches its results file fails. Headings are the one
piece of wording a test names: they are the document's structure, and the anchors its links use.
"""
import os
import re

from conftest import ROOT

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
# A number as prose writes it: an optional sign, thousands separators, a decimal part, an exponent.
# Not part of a name: no letter, digit or underscore before it (sm80), no underscore or digit after (4_gpus).
NUMBER = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![_\d])")


def read(path):
    """The text of a file of the repository (a path relative to its root)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def section(path, heading):
    """The text under the first heading of ``path`` that starts with ``heading`` (any level), up to the next
    heading of the same or a higher level. A missing heading fails, naming the headings there are."""
    lines = read(path).splitlines()
    headings = [(index, len(match.group(1)), match.group(2)) for index, line in enumerate(lines)
                if (match := HEADING.match(line))]
    for position, (index, level, title) in enumerate(headings):
        if title.startswith(heading):
            end = next((later for later, later_level, _ in headings[position + 1:] if later_level <= level),
                       len(lines))
            return "\n".join(lines[index + 1:end])
    raise AssertionError(f"{path} has no heading starting {heading!r}; its headings: "
                         + "; ".join(title for _, _, title in headings))


def prose(text):
    """The prose of a Markdown text, its paragraphs, list items, captions and footnotes on one line each,
    without its tables, code blocks and images: where a number a sentence quotes cannot be matched by a
    table's cell that happens to be equal."""
    from docs.prose import blocks

    return "\n".join(body for kind, body in blocks(text) if kind in ("prose", "caption", "footnote", "details"))


def numbers(text):
    """The numbers written in ``text``, as strings without thousands separators or a typographic minus
    ("1,669.5" -> "1669.5", "−3.2" -> "-3.2"), a leading plus dropped."""
    return [match.replace(",", "").replace("−", "-").lstrip("+") for match in NUMBER.findall(text)]


def assert_quoted(text, *values):
    """Each of ``values`` (strings as the text should write them, e.g. ``f"{x:.1f}"``) is one of the
    numbers written in ``text``. The failure names the values missing and the numbers the text has."""
    written = set(numbers(text))
    missing = [value for value in values if str(value).replace(",", "").lstrip("+") not in written]
    assert not missing, f"not quoted: {missing}; the numbers written there: {sorted(written, key=len)[:80]}"
