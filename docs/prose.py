"""How long the tutorial is to read: words, sentences and paragraphs of README.md and each chapter.

    python -m docs.prose            # a table per file, the learner's core path, the house style's figures
    python -m docs.prose --json     # the same as JSON (tests/test_prose.py reads it)

Counted as the editorial review of the chapters counted them, so that figures compare:
- words are whitespace tokens (``wc -w``); *prose* is paragraphs, list items and block quotes, without
  headings, fenced code, tables, images, HTML comments and footnote definitions;
- a sentence ends at ``.``, ``!`` or ``?`` followed by a capital letter, a backtick or a bracket (colons and
  semicolons do not end one);
- a paragraph is a run of prose lines, or one list item with its indented continuation;
- *running prose* is the prose outside captions (a paragraph set wholly in italics, ``*...*`` or ``_..._``,
  the line that names a table's or figure's command, device and date), footnotes and ``<details>`` blocks:
  dates (YYYY-MM-DD) and commit hashes (hex tokens of 7 to 40 characters with a digit and a letter) are
  counted there, since provenance belongs in captions, footnotes and the measurement notes;
- a *number* is a prose word that starts with a digit, after any bracket or sign (not a name such as H100 or bf16);
- *visible* words leave out ``<details>`` blocks, which a reader opens only to check a claim.

The learner's core path is README.md and chapters 01 to 04: what a learner reads before the optional chapters.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE_PATH = ("README.md", "docs/01-set-up.md", "docs/02-single-device.md", "docs/03-profiling-and-optimisation.md",
             "docs/04-distributed.md")
SENTENCE_END = re.compile(r"(?<=[.!?])(?:\[\^[^\]\s]+\])?\s+(?=[A-Z`\[(])")  # a footnote mark may follow
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
ITALIC = re.compile(r"^(\*[^*].*[^*]\*|_.+_)[.:]?$", re.S)
NUMBER = re.compile(r"^[(\[`*~≈<>+-]*\d")  # a word that starts with a digit: 0.0174, 58, 2026-11-25, 16.4x
ADDRESS = re.compile(r"\b(?:you|your|you're|yours|we|our|let's)\b", re.I)
LONG_SENTENCE, MAX_SENTENCE, LONG_PARAGRAPH = 35, 50, 120  # the house style's caps (words)
WORDS_PER_MINUTE = 200  # the reading times README.md gives each chapter


def tutorial_files(root=ROOT):
    """README.md, then docs/*.md in their numbered order."""
    chapters = sorted(name for name in os.listdir(os.path.join(root, "docs")) if name.endswith(".md"))
    return ["README.md"] + [f"docs/{name}" for name in chapters]


def blocks(text):
    """``[(kind, text)]`` of a Markdown text: kind is prose, caption, footnote, details (prose inside a
    ``<details>`` block), heading, code, table, image or html."""
    found, paragraph, kind_of_paragraph = [], [], None
    in_code = in_comment = False
    details = 0

    def close():
        nonlocal paragraph
        if paragraph:
            joined = " ".join(line.strip() for line in paragraph)
            kind = kind_of_paragraph
            if kind == "prose" and ITALIC.match(joined):
                kind = "caption"
            found.append(("details" if details and kind == "prose" else kind, joined))
        paragraph = []

    for line in text.splitlines():
        stripped = line.strip()
        if in_code:
            in_code = not stripped.startswith(("```", "~~~"))
            continue
        if in_comment:
            in_comment = "-->" not in stripped
            continue
        if stripped.startswith(("```", "~~~")):
            close()
            in_code = True
            found.append(("code", ""))
            continue
        if stripped.startswith("<!--"):
            close()
            in_comment = "-->" not in stripped
            continue
        if stripped.startswith("<details"):
            close()
            details += 1
            continue
        if stripped.startswith("</details"):
            close()
            details = max(0, details - 1)
            continue
        if not stripped:
            close()
            continue
        if stripped.startswith("#"):
            close()
            found.append(("heading", stripped))
            continue
        if stripped.startswith("|"):
            close()
            found.append(("table", stripped))
            continue
        if stripped.startswith("![") or stripped.startswith("<"):
            close()
            found.append(("image" if stripped.startswith("!") else "html", stripped))
            continue
        if re.match(r"^\[\^[^\]]+\]:", stripped):
            close()
            kind_of_paragraph = "footnote"
            paragraph = [stripped]
            continue
        if LIST_ITEM.match(line):
            close()
            kind_of_paragraph = "prose"
            paragraph = [LIST_ITEM.sub("", line)]
            continue
        if not paragraph:
            kind_of_paragraph = "prose"
        paragraph.append(stripped.lstrip("> ").strip() if stripped.startswith(">") else stripped)
    close()
    return found


def sentences(paragraph):
    return [each for each in SENTENCE_END.split(paragraph) if each.strip()]


def words_in_parentheses(paragraph):
    """Words inside (round) parentheses, nested ones once."""
    depth, inside, word = 0, 0, False
    for char in paragraph:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        if char.isspace():
            word = False
        elif not word:
            word = True
            inside += depth > 0
    return inside


def measure(text):
    """The figures of one Markdown text."""
    found = blocks(text)
    prose = [body for kind, body in found if kind == "prose"]
    running = prose
    lengths = [len(each.split()) for paragraph in prose for each in sentences(paragraph)]
    prose_words = sum(len(paragraph.split()) for paragraph in prose)
    paragraphs = [len(paragraph.split()) for paragraph in prose]
    details_words = sum(len(body.split()) for kind, body in found if kind == "details")
    return {
        "words": len(text.split()),
        "visible_words": len(text.split()) - details_words,
        "prose_words": prose_words,
        "sentences": len(lengths),
        "mean_sentence": round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
        f"sentences_over_{LONG_SENTENCE}": sum(length > LONG_SENTENCE for length in lengths),
        f"sentences_over_{MAX_SENTENCE}": sum(length > MAX_SENTENCE for length in lengths),
        "longest_sentence": max(lengths, default=0),
        "paragraphs": len(paragraphs),
        f"paragraphs_over_{LONG_PARAGRAPH}": sum(length > LONG_PARAGRAPH for length in paragraphs),
        "longest_paragraph": max(paragraphs, default=0),
        "dates_in_running_prose": sum(len(DATE.findall(paragraph)) for paragraph in running),
        "hashes_in_running_prose": sum(len(COMMIT.findall(paragraph)) for paragraph in running),
        "percent_in_parentheses": round(100 * sum(map(words_in_parentheses, prose)) / prose_words, 1)
        if prose_words else 0.0,
        "address_per_1000": round(1000 * sum(len(ADDRESS.findall(p)) for p in prose) / prose_words, 1)
        if prose_words else 0.0,
        "numbers_per_100": round(100 * sum(bool(NUMBER.match(word)) for p in prose for word in p.split())
                                 / prose_words, 1) if prose_words else 0.0,
    }


def reading_minutes(words):
    return max(1, round(words / WORDS_PER_MINUTE))


def measure_tutorial(root=ROOT):
    """``{file: figures}`` for README.md and every chapter, with the core path's and the whole's words."""
    figures = {path: measure(open(os.path.join(root, path), encoding="utf-8").read())
               for path in tutorial_files(root)}
    return {"files": figures,
            "core_path": {"files": list(CORE_PATH), "words": sum(figures[path]["words"] for path in CORE_PATH
                                                                    if path in figures),
                          "visible_words": sum(figures[path]["visible_words"] for path in CORE_PATH
                                               if path in figures)},
            "total_words": sum(each["words"] for each in figures.values())}


COLUMNS = [("words", "words"), ("visible_words", "visible"), ("prose_words", "prose"), ("sentences", "sent."),
           ("mean_sentence", "mean"), (f"sentences_over_{LONG_SENTENCE}", f">{LONG_SENTENCE}"),
           (f"sentences_over_{MAX_SENTENCE}", f">{MAX_SENTENCE}"), ("longest_sentence", "longest"),
           (f"paragraphs_over_{LONG_PARAGRAPH}", f"par.>{LONG_PARAGRAPH}"), ("longest_paragraph", "longest par."),
           ("dates_in_running_prose", "dates"), ("hashes_in_running_prose", "hashes"),
           ("percent_in_parentheses", "% in ()"), ("address_per_1000", "you/we per 1k"),
           ("numbers_per_100", "numbers per 100")]


def table(report):
    rows = [["file"] + [label for _, label in COLUMNS]]
    rows += [[path] + [str(figures[key]) for key, _ in COLUMNS] for path, figures in report["files"].items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width) for i, (cell, width)
                       in enumerate(zip(row, widths))) for row in rows]
    lines += ["", "reading times at %d words a minute: %s" % (WORDS_PER_MINUTE, ", ".join(
        f"{os.path.basename(path)[:2]} {reading_minutes(figures['words'])} min"
        for path, figures in report["files"].items() if path != "README.md"))]
    core = report["core_path"]
    lines += ["", f"learner's core path ({', '.join(core['files'])}): {core['words']} words, "
                  f"{core['visible_words']} visible",
              f"all files: {report['total_words']} words"]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--root", default=ROOT, help="the repository to measure (default: this one)")
    args = parser.parse_args(argv)
    report = measure_tutorial(args.root)
    print(json.dumps(report, indent=1) if args.json else table(report))


if __name__ == "__main__":
    sys.exit(main())
