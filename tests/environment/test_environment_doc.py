"""docs/ENVIRONMENT.md against the code:
  1. its generated table is what the options table (base/options.cpp) renders (gen_environment_doc);
  2. every MOELITE_* variable any code in the repository reads from the environment (C/C++, Python,
     shell, JavaScript, Rust, CMake) is listed in it;
  3. the library reads the environment only through base/options.cpp.
Usage: test_environment_doc.py SOURCE_DIR GEN_ENVIRONMENT_DOC_BINARY"""
import os
import re
import subprocess
import sys

root, generator = sys.argv[1], sys.argv[2]
doc = open(os.path.join(root, "docs/ENVIRONMENT.md")).read()
failures = []

# 1. The generated table.
begin, end = "<!-- generated: tools/gen_environment_doc.sh -->\n", "<!-- end generated -->\n"
table = subprocess.run([generator], check=True, capture_output=True, text=True).stdout
if begin not in doc or end not in doc:
    failures.append("docs/ENVIRONMENT.md lacks the generated-table markers")
elif doc[doc.index(begin) + len(begin):doc.index(end)] != table:
    failures.append("docs/ENVIRONMENT.md's table differs from the options table: run bash tools/gen_environment_doc.sh")

# 2. Every variable read anywhere.
C_READ = re.compile(r'getenv\(\s*"(MOELITE_\w+)"')
READS = {  # file name ending -> how code there reads a variable
    (".c", ".cc", ".cpp", ".h", ".cu"): [C_READ],
    (".py",): [re.compile(r'environ(?:\.get)?[\[(]\s*["\'](MOELITE_\w+)["\']'),
               re.compile(r'getenv\(\s*["\'](MOELITE_\w+)["\']')],
    (".sh", "/run"): [re.compile(r'\$\{?(MOELITE_\w+)')],
    (".js",): [re.compile(r'process\.env(?:\.|\[["\'])(MOELITE_\w+)')],
    (".rs",): [re.compile(r'env::var(?:_os)?\(\s*"(MOELITE_\w+)"'), re.compile(r'env!\(\s*"(MOELITE_\w+)"')],
    ("CMakeLists.txt", ".cmake"): [re.compile(r'\$ENV\{(MOELITE_\w+)\}')],
}
SKIP_DIRS = {".git", "node_modules", "target"}
read = {}
for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
    for name in filenames:
        path = os.path.join(dirpath, name)
        patterns = [p for ends, ps in READS.items() if path.endswith(ends) for p in ps]
        if not patterns:
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        rel = os.path.relpath(path, root)
        for pattern in patterns:
            for var in pattern.findall(text):
                read.setdefault(var, set()).add(rel)
# The library's own are in the options table: the table rows name them.
for var in re.findall(r'"(MOELITE_[A-Z0-9_]+)", OptionKind', open(os.path.join(root, "base/options.cpp")).read()):
    read.setdefault(var, set()).add("base/options.cpp")
for var, where in sorted(read.items()):
    if "`%s`" % var not in doc:
        failures.append("%s is read by %s but not listed in docs/ENVIRONMENT.md" % (var, ", ".join(sorted(where))))

# 3. The library reads the environment through the options table only.
for layer in ("base", "platforms", "backends", "core"):
    for dirpath, _, filenames in os.walk(os.path.join(root, layer)):
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel == "base/options.cpp" or not name.endswith((".c", ".cpp", ".h", ".cu")):
                continue
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                if re.search(r'\bgetenv\s*\(', line) and not line.lstrip().startswith("//"):
                    failures.append("%s:%d reads the environment outside base/options.cpp: %s" % (rel, n, line.strip()))

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("docs/ENVIRONMENT.md: %d variables read, all listed; the library's table matches" % len(read))
