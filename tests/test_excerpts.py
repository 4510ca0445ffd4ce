"""The code the tutorial quotes is the code: every ```python block of README.md and docs/*.md opens with a
comment that names a file and a function, e.g. ``# utils/distributed.py, wrap_ddp()`` (a method as
``CropSampler.set_epoch()``), and each of its other lines is a line of that function, in the same order. A line
``...`` stands for lines left out; trailing comments are compared without their text, on both sides.

So an excerpt cannot go stale: renaming the function, or changing or reordering a quoted line, fails here with
the line that no longer matches.
"""
import ast
import os
import re

from conftest import ROOT
from readme_commands import tutorial_texts

SOURCE_LINE = re.compile(r"^# ([\w./-]+\.py), ([\w.]+)\(\)$")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
ELISION = {"...", "# ..."}


def code(line):
    """A line as compared: its indentation and a trailing comment dropped."""
    return re.sub(r"\s+#.*$", "", line).strip()


def function_lines(path, name):
    """The lines of function ``name`` (``Class.method`` for a method) in ``path``, as compared; None if the file
    has no such function."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    body = ast.parse(text).body
    node = None
    for part in name.split("."):
        node = next((each for each in body if isinstance(each, (ast.FunctionDef, ast.ClassDef))
                     and each.name == part), None)
        if node is None:
            return None
        body = node.body
    return [code(line) for line in text.splitlines()[node.lineno - 1:node.end_lineno]]


def excerpts(texts):
    """``[(file, first line, [quoted lines])]`` of every ```python block of ``texts`` ({file: text})."""
    found = []
    for path, text in texts.items():
        for block in PYTHON_BLOCK.findall(text):
            lines = block.rstrip("\n").split("\n")
            found.append((path, lines[0], lines[1:]))
    return found


def mismatches(found):
    """What does not match its source, one line per excerpt: a missing or unknown source line, or the first
    quoted line that is not the next such line of the named function."""
    wrong = []
    for path, header, lines in found:
        named = SOURCE_LINE.match(header)
        if not named:
            wrong.append(f"{path}: a python block must open with '# <file>.py, <function>()', not {header!r}")
            continue
        source, function = named.groups()
        if not os.path.isfile(os.path.join(ROOT, source)):
            wrong.append(f"{path}: {source} does not exist")
            continue
        body = function_lines(source, function)
        if body is None:
            wrong.append(f"{path}: {source} has no function {function}()")
            continue
        position = 0
        for line in lines:
            if line.strip() in ELISION:
                continue
            try:
                position = body.index(code(line), position) + 1
            except ValueError:
                wrong.append(f"{path}: {line.strip()!r} is not the next line of {source}'s {function}()")
                break
    return wrong


def test_every_python_excerpt_is_the_code_of_the_function_it_names():
    found = excerpts(tutorial_texts(ROOT))
    chapter = [each for each in found if each[0] == "docs/04-distributed.md"]
    assert len(chapter) >= 3, "docs/04 quotes the process group, the loaders' sampler and the DDP wrap"
    assert mismatches(found) == []


def test_an_excerpt_that_left_its_source_is_found():
    """The check itself: a changed line, lines out of order, an unknown function and a block without its source
    line are each reported; an elision and a comment's other wording are not."""
    good = ("# utils/distributed.py, wrap_ddp()\noptions = {\n...\n"
            "model = DistributedDataParallel(model, **options)  # another comment\n")
    assert mismatches(excerpts({"a.md": f"```python\n{good}```\n"})) == []
    changed = good.replace("**options", "**kwargs")
    swapped = ("# utils/distributed.py, wrap_ddp()\nmodel = DistributedDataParallel(model, **options)\n"
               "options = {\n")
    unknown = "# utils/distributed.py, wrap_everything()\noptions = {\n"
    bare = "options = {\n"
    for block in (changed, swapped, unknown, bare):
        assert len(mismatches(excerpts({"a.md": f"```python\n{block}```\n"}))) == 1, block
