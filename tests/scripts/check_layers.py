"""The layers hold: every `#include "..."` in the library's sources points down or sideways within
its own layer, never up (docs/design/layers.md, "Layers and folders"):

    4  include/onebit/*.hpp      the C++ shims, over the C ABI alone
    3  include/onebit/onebit.h, preload.h              the C ABI's calls, which the doors implement
       plugin/capi, plugin/preload, plugin/nccl_net    the front doors (one layer: the doors share
                                 the ABI guards of plugin/capi)
    2  engine | optim                                  the engine; the optimizer core
    1  kernels | transport                             the movers
    0  common                                          below everything

Folders side by side in one layer (`|`) do not include each other. One header is the vocabulary
every layer may use: include/onebit/onebit_types.h, the C ABI's plain types and result codes, which
itself includes nothing of onebit's. A core file that includes onebit.h for a type is reported
(onebit.h is the doors' layer). tools/, tests/ and python/ stand outside and may include anything.

    python3 tests/scripts/check_layers.py SOURCE_DIR                 # exit 1 naming each upward include
    python3 tests/scripts/check_layers.py SOURCE_DIR --plant FILE HEADER
        # the same, as if FILE also included HEADER: the test that the check can fail
"""
import os
import re
import sys

LAYERS = [  # (folder prefix, or a file's exact path, layer, side): the first that matches
    ("include/onebit/onebit.h", 3, "doors"), ("include/onebit/preload.h", 3, "doors"),
    ("include/onebit/", 4, "shims"),
    ("plugin/capi/", 3, "doors"), ("plugin/preload/", 3, "doors"), ("plugin/nccl_net/", 3, "doors"),
    ("engine/", 2, "engine"), ("optim/", 2, "optim"),
    ("kernels/", 1, "kernels"), ("transport/", 1, "transport"),
    ("common/", 0, "common"),
]
VOCABULARY = {"include/onebit/onebit_types.h"}
SOURCES = (".h", ".hpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    for prefix, layer, side in LAYERS:
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return layer, side
    return None


def resolve(root, path, header):
    """A quoted include of `path` as a path from the root: the including file's folder first (as the
    compiler searches it), then the include directories, the root and include/."""
    for candidate in (os.path.join(os.path.dirname(path), header), header, os.path.join("include", header)):
        if os.path.exists(os.path.join(root, candidate)):
            return os.path.normpath(candidate)
    return None


def upward(root, path, header):
    """Why `path` including `header` breaks the layers, or None."""
    target = resolve(root, path, header)
    here = layer_of(path)
    if path in VOCABULARY and target is not None:
        return f"{path}, the vocabulary every layer may include, includes {target}: it must stand alone"
    if target is None or here is None or target in VOCABULARY:
        return None
    there = layer_of(target)
    if there is None:
        return f"{path} includes {target}, outside every layer (tools/ or tests/?)"
    if there[0] > here[0]:
        return f"{path} (layer {here[0]}, {here[1]}) includes {target} (layer {there[0]}, {there[1]}): upward"
    if there[0] == here[0] and there[1] != here[1] and here[1] != "doors":
        return f"{path} ({here[1]}) includes {target} ({there[1]}): two sides of layer {here[0]}"
    return None


def main():
    if len(sys.argv) not in (2, 5) or (len(sys.argv) == 5 and sys.argv[2] != "--plant"):
        print(__doc__)
        return 2
    root = os.path.abspath(sys.argv[1])
    planted = (sys.argv[3], sys.argv[4]) if len(sys.argv) == 5 else None
    problems, files = [], 0
    for prefix, _, _ in LAYERS:
        if not prefix.endswith("/"):
            continue  # a file of a folder walked below
        for folder, _, names in os.walk(os.path.join(root, prefix)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                files += 1
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    headers = INCLUDE.findall(f.read())
                if planted and planted[0] == path:
                    headers.append(planted[1])
                problems += [why for why in (upward(root, path, h) for h in headers) if why]
    if planted and not any(planted[0] in p for p in problems):
        print(f"the planted include ({planted[0]} -> {planted[1]}) was not reported")
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        return 1
    print(f"OK: {files} sources, every include points down or within its layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
