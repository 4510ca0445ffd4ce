"""README.md: every relative link and image points at something that exists; the Quick start is there."""
import os
import re

from conftest import ROOT

README = open(os.path.join(ROOT, "README.md")).read()


def relative_targets(text):
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not target.startswith(("http://", "https://", "#", "mailto:")):
            yield target.split("#")[0]


def anchors(text):
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces to dashes."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_relative_link_and_image_exists():
    targets = list(relative_targets(README))
    assert targets, "the README links to the code"
    missing = [t for t in targets if not os.path.exists(os.path.join(ROOT, t))]
    assert not missing, missing


def test_every_section_link_has_its_heading():
    links = re.findall(r"\]\(#([^)]+)\)", README)
    assert links and not set(links) - anchors(README), set(links) - anchors(README)


def test_quick_start_has_the_two_commands_and_ci_runs_the_second():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make demo" in quick_start and "make test" in quick_start
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^make test$", ci, flags=re.M)
