#!/usr/bin/env python3
"""Fingerprint every kernel of a CUDA binary, to see which kernels a source
change really changed.

    cuobjdump -sass build-gpu/core/libgdnkit.so | tools/sass_hash.py | sort > a.txt
    (rebuild)
    cuobjdump -sass build-gpu/core/libgdnkit.so | tools/sass_hash.py | sort > b.txt
    diff a.txt b.txt

Prints one line a function: arch, mangled name, a hash of its instructions
(addresses and encodings stripped, so code that only moved hashes the same)
and its instruction count. A name may appear more than once (the same
instantiation in several translation units).
"""
import hashlib
import re
import sys

ARCH = re.compile(r"\s*arch = (\S+)")
FUNCTION = re.compile(r"\s*Function : (\S+)")
# "        /*0040*/   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;   /* 0x... */"
INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s*(.*?)\s*;?\s*/\* 0x[0-9a-f]+ \*/")


def main() -> None:
    arch, name, digest, count = None, None, None, 0

    def flush() -> None:
        if name is not None:
            print(arch, name, digest.hexdigest()[:16], count)

    for line in sys.stdin:
        m = ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        m = FUNCTION.match(line)
        if m:
            flush()
            name, digest, count = m.group(1), hashlib.sha1(), 0
            continue
        m = INSTRUCTION.match(line) if name is not None else None
        if m:
            digest.update(m.group(1).encode())
            count += 1
    flush()


if __name__ == "__main__":
    main()
