"""docs/prose.py counts what the house style caps: words, sentences, paragraphs and provenance in running prose;
and the tutorial's files stay within the figures docs/prose_budget.json allows them (the budget only goes down)."""
import json
import os
import subprocess
import sys

from conftest import ROOT, timeout_for
from docs import prose

TEXT = """# A heading of several words that is not prose

Run the demo. It trains for two epochs (about a minute on a laptop) and prints the loss! Does it halve?
`make demo` is the command.

- A list item is a paragraph of its own, measured on 2026-11-25 at 8647ee9.
  Its indented continuation belongs to it.
- Another item.

| a table | 2026-11-25 |
|---|---|
| is not prose | at all |

*Measured by `python -m benchmarks.ladder` on one H100, 2026-11-25.*

```
code 2026-11-25 is not prose either
```

<details><summary>Measurement notes</summary>

A long audit, measured 2026-11-26, that a reader opens only to check a claim.

</details>

[^h100]: One H100 80GB HBM3, 2026-11-25.

> We quote the original: you run it.
"""


def test_prose_is_paragraphs_list_items_and_quotes_without_headings_code_tables_captions_or_notes():
    kinds = [kind for kind, _ in prose.blocks(TEXT)]
    assert kinds.count("prose") == 4  # the paragraph, two list items, the block quote
    assert {"heading", "table", "code", "caption", "details", "footnote"} <= set(kinds)
    first_item = [body for kind, body in prose.blocks(TEXT) if kind == "prose"][1]
    assert first_item.endswith("Its indented continuation belongs to it.")


def test_sentences_end_before_a_capital_a_backtick_or_a_bracket():
    paragraph = "Run the demo. It trains (fast) and prints the loss! Does it halve? `make demo` is it. (Yes.) e.g. not here"
    assert [len(each.split()) for each in prose.sentences(paragraph)] == [3, 7, 3, 4, 4]
    assert prose.sentences("The first took 218 s.[^epochs] The later ones took 5 s.") == [
        "The first took 218 s.", "The later ones took 5 s."]  # a footnote's mark ends it too


def test_the_figures_of_a_text():
    figures = prose.measure(TEXT)
    assert figures["words"] == len(TEXT.split())
    details = len("A long audit, measured 2026-11-26, that a reader opens only to check a claim.".split())
    assert figures["visible_words"] == figures["words"] - details
    # Dates and hashes are counted in running prose only: the list item's, not the table's, caption's,
    # code's, footnote's or the details block's.
    assert figures["dates_in_running_prose"] == 1 and figures["hashes_in_running_prose"] == 1
    assert figures["sentences"] == 4 + 2 + 1 + 1  # the paragraph (its second line too), the items, the quote
    assert figures["percent_in_parentheses"] > 0 and figures["address_per_1000"] > 0
    # Numbers: the list item's date and hash, the prose's only words with a digit ("two" is a word).
    assert figures["numbers_per_100"] == round(100 * 2 / figures["prose_words"], 1)


def test_a_long_sentence_and_a_long_paragraph_count_against_the_caps():
    long_sentence = " ".join(["word"] * 51) + "."
    figures = prose.measure(f"{long_sentence} Short one.\n\n" + " ".join(["Short sentence."] * 70) + "\n")
    assert figures["sentences_over_35"] == figures["sentences_over_50"] == 1
    assert figures["longest_sentence"] == 51
    assert figures["paragraphs_over_120"] == 1 and figures["longest_paragraph"] == 140


def test_the_command_prints_every_file_and_the_core_path():
    result = subprocess.run([sys.executable, "-m", "docs.prose", "--json"], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_for(60))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert list(report["files"]) == prose.tutorial_files()
    assert report["core_path"]["words"] == sum(report["files"][path]["words"] for path in prose.CORE_PATH)


def test_the_readme_gives_each_chapter_its_reading_time():
    """README.md's chapter list: "(core|optional|for maintainers, N min)" for every chapter, N its words at
    docs/prose.py's reading speed, give or take a fifth (or 2 minutes), so that a stale time fails here."""
    import re

    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    stated = dict(re.findall(r"\]\((docs/\d\d-[\w-]+\.md)\) \((?:core|optional|for maintainers), (\d+) min\)", readme))
    chapters = [path for path in prose.tutorial_files() if path != "README.md"]
    assert sorted(stated) == chapters
    for path, minutes in stated.items():
        words = len(open(os.path.join(ROOT, path), encoding="utf-8").read().split())
        expected = prose.reading_minutes(words)
        assert abs(int(minutes) - expected) <= max(2, expected / 5), (path, minutes, expected)


# Every file of the tutorial keeps the house style, within its word budget: the lesson layer (README.md and
# chapters 01-04) within the redesign's; the optional chapters and the maintainers' at their size when edited.
STYLE_WORDS = {"README.md": 1200, "docs/01-set-up.md": 900, "docs/02-single-device.md": 2500,
               "docs/03-profiling-and-optimisation.md": 4500, "docs/04-distributed.md": 4300,
               "docs/05-scaling-model.md": 3500, "docs/06-domain-parallelism.md": 2050,
               "docs/07-differences-from-the-original.md": 1650, "docs/08-tests.md": 2800,
               "docs/09-going-further.md": 7100, "docs/10-going-further-distributed.md": 3760}
CORE_PATH_WORDS = 13000  # what the learner reads before the optional chapters: README.md and chapters 01-04


def test_every_file_keeps_the_house_style():
    """Sentences of 50 words at most, paragraphs of 120, no dates or commit hashes in running prose (they go in
    captions, footnotes and the measurement notes), and each file within its word budget; the learner's core
    path within its own."""
    report = prose.measure_tutorial()
    assert report["core_path"]["words"] <= CORE_PATH_WORDS
    assert set(STYLE_WORDS) == set(report["files"])  # a new chapter gets its budget here
    for path, budget in STYLE_WORDS.items():
        figures = report["files"][path]
        assert figures["words"] <= budget, (path, figures["words"], budget)
        assert figures["longest_sentence"] <= prose.MAX_SENTENCE, (path, figures["longest_sentence"])
        assert figures["longest_paragraph"] <= prose.LONG_PARAGRAPH, (path, figures["longest_paragraph"])
        assert figures["dates_in_running_prose"] == figures["hashes_in_running_prose"] == 0, path
