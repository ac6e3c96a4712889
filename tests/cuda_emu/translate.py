#!/usr/bin/env python3
"""mxemu's source rewrite (see emu.h): a .cu file into C++ that g++ compiles against mxemu.

  translate.py SRC.cu OUT.cpp

Two constructs of CUDA C++ are not C++, and only these are rewritten; every other line is kept
as it is, and a #line directive keeps g++'s messages pointing into SRC:
  name<<<grid, block[, smem[, stream]]>>>(args)
      ->  ::mxemu::launch(::mxemu::Config(grid, block...), &name or nullptr, "name",
                          [=](auto&&... a) { name(a...); })(args)
  extern __shared__ T name[];                   ->  T* name = ::mxemu::dynamic_shared<T>();
  __shared__ T name[N];                         ->  the same, then ::mxemu::block_shared(&name, sizeof name);
                                                    (filled with 0xFF once a block, bytes counted)
The kernel is called through a generic lambda (capturing nothing by reference: the launch may run
after the calling function returns, see emu.h's "Streams") so that a kernel template's arguments are deduced
from the call's, as nvcc does; its address (what cudaFuncSetAttribute is given) is taken where the
source names one: a kernel that is not a template, or a template named with its arguments.
A launch syntax left over (one this rewrite does not recognise) is an error, not a silent skip.
"""
import os
import re
import sys

# The kernel: an identifier, optionally qualified, optionally with one level of template
# arguments. The configuration: anything up to the first '>>>' (it may contain '>').
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:\s*<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
# A static shared array: `__shared__ T name[N]...;` (one declarator).
STATIC_SHARED = re.compile(r"(__shared__\s+[\w:<>, ]+?\s+(\w+)\s*(?:\[[^\]]+\]\s*)*;)")
SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")


TEMPLATE_KERNEL = re.compile(r"template\s*<[^{;]*?>\s*__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(", re.S)


def translate(text):
    templates = set(TEMPLATE_KERNEL.findall(text))

    def launch(m):
        name, config = m.group(1).strip(), m.group(2)
        deduced = name in templates  # a template named without its arguments
        kernel_id = "nullptr" if deduced else "reinterpret_cast<const void*>(&%s)" % name
        return '::mxemu::launch(::mxemu::Config(%s), %s, "%s", [=](auto&&... mxemu_a) { %s(mxemu_a...); })(' % (
            config, kernel_id, name, name)

    text = LAUNCH.sub(launch, text)
    text = STATIC_SHARED.sub(lambda m: "%s ::mxemu::block_shared(&%s, sizeof %s);" % (m.group(1), m.group(2), m.group(2)), text)
    text = SHARED.sub(lambda m: "%s* %s = ::mxemu::dynamic_shared<%s>();" % (m.group(1), m.group(2), m.group(1)), text)
    return text


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: translate.py SRC.cu OUT.cpp")
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    result = translate(text)
    for n, line in enumerate(result.splitlines(), 1):
        if "<<<" in line or re.search(r"\bextern\s+__shared__", line):
            sys.exit("%s: line %d: a launch or shared declaration mxemu cannot rewrite: %s" % (src, n, line.strip()))
    # Rewritten launches span as many lines as before (the replacement adds no newline), so the
    # #line directive keeps every later line's number.
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write('#line 1 "%s"\n' % src)
        f.write(result)


if __name__ == "__main__":
    main()
