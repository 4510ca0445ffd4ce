"""tests/quotes.py: the numbers a text quotes, found under its headings, whatever the wording around them."""
import pytest

import quotes


def test_numbers_are_read_as_prose_writes_them_and_names_are_not_numbers():
    text = "It ran 1,669.5 samples/s, −3.2% and +6.5%, an error of 2.1e-5, 1.8x; sm80, 4_gpus, 64^3."
    assert quotes.numbers(text) == ["1669.5", "-3.2", "6.5", "2.1e-5", "1.8", "64", "3"]


def test_a_section_runs_to_the_next_heading_of_its_level_or_higher():
    readme = quotes.read("README.md")
    first = next(line[3:] for line in readme.splitlines() if line.startswith("## "))
    body = quotes.section("README.md", first)
    assert body and "\n## " not in "\n" + body and body.strip() in readme
    with pytest.raises(AssertionError, match="has no heading starting"):
        quotes.section("README.md", "A heading no file has")


def test_a_number_is_quoted_or_the_failure_names_it():
    quotes.assert_quoted("2.23 and 1,234 ms, and 12%", "2.23", "1234", "12")
    with pytest.raises(AssertionError, match=r"not quoted: \['2.24'\]"):
        quotes.assert_quoted("2.23 and 1,234 ms", "2.23", "2.24")


def test_the_prose_of_a_section_leaves_out_its_tables_and_code():
    text = ("Two runs took 4.2 ms.\n\n| run | ms |\n|---|---|\n| a | 5.1 |\n\n"
            "```bash\necho 6.3\n```\n\n*Measured: 7.4.*\n")
    assert quotes.numbers(quotes.prose(text)) == ["4.2", "7.4"]
    with pytest.raises(AssertionError, match=r"not quoted: \['5.1'\]"):
        quotes.assert_quoted(quotes.prose(text), "4.2", "5.1")
