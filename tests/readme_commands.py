"""The tutorial's files (README.md, then the chapters in docs/), the command lines of their ```bash
blocks, and a scratch copy of the repository to run them in.

Used by tests/test_readme.py, which classifies every command (run, or not run and why) and runs the
CPU ones. A command here is what a reader would paste: backslash continuations joined, comments
dropped, and a ``for ... done`` loop kept whole as one command.
"""
import glob
import os
import re
import shlex
import shutil
import sys

# What a scratch directory links to (read-only use): the code, configs and build files. benchmarks/ is
# a real folder of links instead, because the ladder writes its results next to its own file.
LINKED = ["train.py", "train_graph.py", "utils", "networks", "config", "benchy_config.yaml", "export_DDP_vars.sh",
          "submit_pm.sh", "Makefile", "requirements.txt", "requirements-test.txt", "requirements-dali.txt",
          "example_logs", "sample_nsys_profiles", "start_tensorboard.ipynb", "figures"]


def tutorial_files(root):
    """The tutorial in reading order: README.md (the hub), then the chapters docs/NN-*.md by number."""
    chapters = sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return ["README.md"] + [os.path.relpath(path, root) for path in chapters]


def tutorial_texts(root):
    """{path relative to ``root``: text} of the tutorial's files, in reading order."""
    texts = {}
    for path in tutorial_files(root):
        with open(os.path.join(root, path)) as f:
            texts[path] = f.read()
    return texts


def tutorial_text(root):
    """The tutorial's files as one text, in reading order (for what is quoted somewhere in it)."""
    return "\n".join(tutorial_texts(root).values())


def bash_blocks(text):
    """The bodies of the ```bash code blocks, in order."""
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)


def strip_comment(line):
    """The line without a shell comment: a '#' that starts a word outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(block):
    """The commands of one code block, each as one line with single spaces."""
    lines, pending = [], ""
    for raw in block.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = strip_comment(pending + raw)
        pending = ""
        if line.strip():
            lines.append(" ".join(line.split()))
    result, loop, depth = [], [], 0
    for line in lines:
        if loop or re.match(r"(for|while|until) ", line):
            loop.append(line)
            depth += len(re.findall(r"(?:^|;\s*|\s)do\b", line)) - len(re.findall(r"(?:^|;\s*)done\b", line))
            if depth == 0:
                result.append(re.sub(r"\bdo; ", "do ", "; ".join(loop)))
                loop = []
            continue
        result.append(line)
    assert not loop, f"an unterminated loop in a README code block: {loop}"
    return result


def readme_commands(text):
    """Every distinct command of the bash blocks of ``text`` (e.g. ``tutorial_text(root)``), in order of
    first appearance."""
    seen = []
    for block in bash_blocks(text):
        for command in commands(block):
            if command not in seen:
                seen.append(command)
    return seen


def shell_line(command, python=sys.executable):
    """The command as bash runs it here: ``python``, ``.venv/bin/...`` and ``torchrun`` become this
    interpreter's (torchrun as ``python -m torch.distributed.run --standalone``, so that concurrent
    runs never share a rendezvous port)."""
    match = re.match(r"((?:\w+=\S*\s+)*)(\S+)(.*)", command)
    assignments, program, rest = match.groups()
    bin_dir = os.path.dirname(python)
    if program == "python":
        program = shlex.quote(python)
    elif program.startswith(".venv/bin/"):
        program = shlex.quote(os.path.join(bin_dir, program[len(".venv/bin/"):]))
    elif program == "torchrun":
        standalone = "" if "--standalone" in rest else " --standalone"
        program = shlex.quote(python) + " -m torch.distributed.run" + standalone
    return assignments + program + rest


def make_scratch(directory, root):
    """A working copy of the repository's top level in ``directory``: links to the code, an empty
    ``data/``, its own ``benchmarks/`` folder, and a ``.venv`` that is a view of the running
    interpreter's virtual environment (marked as installed, so that make installs nothing)."""
    directory = str(directory)
    for name in LINKED:
        os.symlink(os.path.join(root, name), os.path.join(directory, name))
    os.makedirs(os.path.join(directory, "data"))
    os.makedirs(os.path.join(directory, "benchmarks"))
    for name in os.listdir(os.path.join(root, "benchmarks")):
        if name.endswith((".py", ".sh")):
            os.symlink(os.path.join(root, "benchmarks", name), os.path.join(directory, "benchmarks", name))
    if sys.prefix != sys.base_prefix:  # a venv: link its parts, so .venv/bin/python is this environment
        venv = os.path.join(directory, ".venv")
        os.makedirs(venv)
        for name in os.listdir(sys.prefix):
            if not name.startswith("."):
                os.symlink(os.path.join(sys.prefix, name), os.path.join(venv, name))
        for stamp in (".installed", ".installed-test", ".installed-figures"):
            open(os.path.join(venv, stamp), "w").close()
    return directory


def copy_data(pairs):
    """Copy (source, destination) files, making folders; copies, so that a run may overwrite them."""
    for source, destination in pairs:
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copyfile(source, destination)
