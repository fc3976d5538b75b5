"""docs/ stays a set of reference pages (docs/README.md): short pages, no issue numbers, no links to
pages or files that are gone.

    python3 tests/scripts/check_docs.py SOURCE_DIR [--max-lines N]
        # exit 1 naming each file and line that breaks a rule; 0 and "OK: ..." otherwise

Rules:
  - no docs/**/*.md longer than N lines (default 400);
  - no issue number in docs/ ("issue 13", "Issue #5", "issues 46-49"): history, with its issue
    numbers, is CHANGELOG.md's at the root, which this check does not read;
  - every relative markdown link in docs/**/*.md ("[text](design/engine.md#...)",
    "![plot](img/x.png)") names a file that exists;
  - every path "docs/....md" (or .txt, .json, .png) written anywhere in the tree's sources, docs
    and scripts names a file that exists, and where it is followed by a quoted section name
    (docs/usage/pytorch.md, "Which torch") that page has a heading containing that name.
"""
import os
import re
import sys

MAX_LINES = 400
# "issue 13", "issues 46–49", "Issue #5"; the words may wrap onto the next line. Not "pytorch#1".
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"(?<![\w/.-])(docs/[\w./-]*\w\.(?:md|txt|json|png))"
                      r"((?:,\s*|\s*\(|\s+)\\?\"([^\"\\\n]+(?:\n[^\"\\\n]+)?)\\?\")?")
SOURCES = (".md", ".py", ".h", ".hpp", ".cc", ".cu", ".cuh", ".sh", ".cmake", ".txt", ".toml", ".map")
SKIP_DIRS = {".git", "build", ".deps", "__pycache__", ".venv", "node_modules"}
HEADING = re.compile(r"^#+\s+(.*?)\s*#*$")
RUN_IN = re.compile(r"\*\*([^*]+?)\*\*")


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def normal(s):
    """Lower case, one space, no backticks, no trailing stop, no comment markers of a wrapped line."""
    s = re.sub(r"\n\s*(//|#|\*)?", " ", s.replace("`", ""))
    return " ".join(s.split()).rstrip(".:").lower()


def headings(path, cache={}):
    """Every heading of a markdown page and every bold run-in heading ("**The wheel.** ..."),
    normalised."""
    if path not in cache:
        found = []
        with open(path, encoding="utf-8") as f:
            fence = False
            for line in f:
                if line.startswith("```"):
                    fence = not fence
                    continue
                if fence:
                    continue
                m = HEADING.match(line)
                if m:
                    found.append(normal(m.group(1)))
                found += [normal(b) for b in RUN_IN.findall(line)]
        cache[path] = found
    return cache[path]


def tree_files(root):
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build"))
        for name in sorted(files):
            if name.endswith(SOURCES) or name in ("CMakeLists.txt",) or "." not in name:
                yield os.path.join(here, name)


def check_page(root, path, max_lines, failures):
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    count = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if count > max_lines:
        failures.append(f"{rel}: {count} lines (over {max_lines}): split it by subject")
    for m in ISSUE.finditer(text):
        failures.append(f"{rel}:{line_of(text, m.start())}: issue number \"{' '.join(m.group(0).split())}\" "
                        "(history and its issue numbers belong in CHANGELOG.md)")
    fence = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0]
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file_part))):
                failures.append(f"{rel}:{number}: link to {target}, which does not exist")


def check_paths(root, path, failures):
    rel = os.path.relpath(path, root)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError):
        return
    for m in DOC_PATH.finditer(text):
        target = os.path.join(root, m.group(1))
        where = f"{rel}:{line_of(text, m.start())}"
        if not os.path.exists(target):
            failures.append(f"{where}: {m.group(1)} does not exist")
        elif m.group(3) and target.endswith(".md"):
            wanted = normal(m.group(3))
            if not any(wanted in h or h.startswith(wanted) for h in headings(target)):
                failures.append(f"{where}: {m.group(1)} has no heading \"{' '.join(m.group(3).split())}\"")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    root = os.path.abspath(argv[1])
    max_lines = int(argv[argv.index("--max-lines") + 1]) if "--max-lines" in argv else MAX_LINES
    failures = []
    pages = 0
    for here, dirs, files in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".md"):
                pages += 1
                check_page(root, os.path.join(here, name), max_lines, failures)
    for path in tree_files(root):
        check_paths(root, path, failures)
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return 1
    print(f"OK: {pages} pages under docs/, each at most {max_lines} lines, no issue numbers, every docs/ path and link found")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
