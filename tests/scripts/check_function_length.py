"""No function in the given folders runs longer than a screen (docs/design/engine.md, "The algorithms in
named steps"): each is a sequence of steps short enough to name, so a long one is a step that has
not been named yet.

    python3 tests/scripts/check_function_length.py SOURCE_DIR FOLDER... [--max LINES]
        # exit 1 naming each function (outermost body; lambdas and local classes count with it)
        # longer than LINES (default 80), with its file and first line

A brace matcher, not a C++ parser: comments and string literals are blanked first, then a `{`
opens a function body when the text before it since the last `;`, `{` or `}` has a parameter
list and is not a control statement, a lambda, or a class.
"""
import os
import re
import sys

SOURCES = (".h", ".hpp", ".cc", ".cu", ".cuh")
CONTROL = re.compile(r"\b(if|for|while|switch|catch)\s*\($|^(else|do|try)$")
SCOPE = re.compile(r"^(template\s*<.*>\s*)?(namespace|class|struct|union|enum)\b|=\s*$|^(extern\s+\"\")")


def blank_comments_and_strings(text):
    """The text with comments and literals' contents removed; every newline kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            end = text.find("*/", i) + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < n and text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            out.append(quote * 2)
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def opens_function(head):
    """Whether the text before a `{` is a function's signature."""
    head = " ".join(head.split())
    if ")" not in head or SCOPE.search(head):
        return False
    if re.search(r"\]\s*(\(.*\))?\s*(mutable\s*)?(->[^{]*)?$", head):
        return False  # a lambda
    before_parameters = head[: head.find("(") + 1]
    return not CONTROL.search(before_parameters) and not CONTROL.search(head)


def long_functions(path, limit):
    text = blank_comments_and_strings(open(path, encoding="utf-8", errors="replace").read())
    found, stack, head_start, line = [], [], 0, 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            head = text[head_start:i]
            stack.append((opens_function(head) and not any(is_fn for is_fn, _, _ in stack), line,
                          " ".join(head.split())[:100]))
            head_start = i + 1
        elif c in "};":
            if c == "}" and stack:
                outermost_function, first, head = stack.pop()
                if outermost_function and line - first + 1 > limit:
                    found.append((line - first + 1, first, head))
            head_start = i + 1
    return found


def main():
    args = sys.argv[1:]
    limit = 80
    if "--max" in args:
        at = args.index("--max")
        limit = int(args[at + 1])
        del args[at:at + 2]
    if len(args) < 2:
        print(__doc__)
        return 2
    root, problems, files = os.path.abspath(args[0]), [], 0
    for folder in args[1:]:
        for where, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(n for n in names if n.endswith(SOURCES)):
                path = os.path.join(where, name)
                files += 1
                for length, first, head in long_functions(path, limit):
                    problems.append(f"{os.path.relpath(path, root)}:{first}: {length} lines (over {limit}): {head}")
    for problem in problems:
        print(problem)
    print(f"{files} files, {len(problems)} functions over {limit} lines")
    return 1 if problems or files == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
