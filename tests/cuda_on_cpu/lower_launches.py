#!/usr/bin/env python3
"""Writes a .cu file as C++ for the CUDA stand-in (cuda_runtime.h here): every launch

    kernel<<<grid, block, shared, stream>>>(arguments);

becomes

    ::onebit_cuda_on_cpu::launch_kernel(std::make_tuple(arguments),
                                        [](auto&&... a) { kernel(a...); }, grid, block, shared, stream);

(the arguments evaluated once, on the launching thread), every `__shared__ T name[...];` is
followed by `::onebit_cuda_on_cpu::shared_memory(&name, sizeof(name));` (so that each block finds
it scribbled), both on the lines they came from, and a `#line` keeps compiler messages pointing at
the .cu file. Fails, naming the line, on a `<<<` it cannot rewrite, so a launch is never left out
silently.

    lower_launches.py SOURCE.cu OUTPUT.cc
"""
import os
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\)\s*;", re.DOTALL)
SHARED = re.compile(r"(__shared__\s+[^;(){}]*?\b(\w+)\s*(?:\[[^;]*?\])?\s*;)")


def lower(text):
    def rewrite(match):
        kernel, shape, arguments = (" ".join(part.split()) for part in match.groups())  # one line
        call = (f"::onebit_cuda_on_cpu::launch_kernel(std::make_tuple({arguments}), "
                f"[](auto&&... a) {{ {kernel}(a...); }}, {shape});")
        return call + "\n" * match.group(0).count("\n")  # the same line count: #line stays true
    text = LAUNCH.sub(rewrite, text)
    return SHARED.sub(r"\1 ::onebit_cuda_on_cpu::shared_memory(&\2, sizeof(\2));", text)


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
    # Its folder may not exist yet: Ninja makes a custom command's output folders, Make does not.
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        f.write(f'#line 1 "{source}"\n{lowered}')


if __name__ == "__main__":
    main()
