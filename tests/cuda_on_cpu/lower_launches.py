#!/usr/bin/env python3
"""Writes a .cu file as C++ for the CUDA stand-in (cuda_runtime.h here): every launch

    kernel<<<grid, block, shared, stream>>>(arguments);

becomes

    ::onebit_cuda_on_cpu::launch([&] { kernel(arguments); }, grid, block, shared, stream);

and a `#line` keeps compiler messages pointing at the .cu file. Fails, naming the line, on a `<<<`
it cannot rewrite, so a launch is never left out silently.

    lower_launches.py SOURCE.cu OUTPUT.cc
"""
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\)\s*;", re.DOTALL)


def lower(text):
    def rewrite(match):
        kernel, shape, arguments = match.groups()
        call = f"::onebit_cuda_on_cpu::launch([&] {{ {kernel}({arguments}); }}, {shape});"
        return call + "\n" * match.group(0).count("\n")  # the same line count: #line stays true
    return LAUNCH.sub(rewrite, text)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, output = sys.argv[1], sys.argv[2]
    with open(source) as f:
        text = f.read()
    lowered = lower(text)
    for number, line in enumerate(lowered.splitlines(), 1):
        if "<<<" in line or ">>>" in line:
            sys.exit(f"{source}:{number}: a launch lower_launches.py could not rewrite: {line.strip()}")
    with open(output, "w") as f:
        f.write(f'#line 1 "{source}"\n{lowered}')


if __name__ == "__main__":
    main()
