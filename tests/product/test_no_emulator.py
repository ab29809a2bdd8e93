"""The library a default configure builds and installs carries no CUDA emulator: its symbol table
names nothing of the SIMT emulator, the emulated runtime or the emulator's kernel table, while the
test build's library (configured with -DMOELITE_CUDA_EMULATOR=ON) names them all -- so the check
can fail. Prints both sizes.
Usage: test_no_emulator.py PRODUCT_LIBRARY TEST_LIBRARY"""
import os
import re
import subprocess
import sys

EMULATOR = re.compile(r"moelite::simt::|moelite::cuda::\(anonymous namespace\)::EmuRuntime|moelite::cuda::emu_kernels|"
                      r"emu_fail_nth_operation_for_testing|moelite::cuda::emulator_kernels")


def emulator_symbols(path):
    out = subprocess.run(["nm", "-C", path], check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if EMULATOR.search(line)]


product, test = sys.argv[1], sys.argv[2]
in_product, in_test = emulator_symbols(product), emulator_symbols(test)
print("product library %s: %d bytes, %d emulator symbols" % (product, os.path.getsize(product), len(in_product)))
print("test library    %s: %d bytes, %d emulator symbols" % (test, os.path.getsize(test), len(in_test)))
if in_product:
    print("\n".join(in_product[:20]))
    sys.exit("the product library carries the CUDA emulator")
if len(in_test) < 10:
    sys.exit("the test library should carry the emulator (is the pattern stale?): %d symbols" % len(in_test))
