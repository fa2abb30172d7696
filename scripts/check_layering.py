#!/usr/bin/env python3
"""Checks the include edges of the tree against the layer table of
docs/ARCHITECTURE.md (between <!-- layers:begin --> and <!-- layers:end -->).

A library folder (a row of the table) may include its own headers and those
of every layer in the transitive closure of the layers its row lists: an edge
to any other layer is upward (or sideways) and fails, named with its file and
line. Also checked:

  - every top-level folder with C++ sources is a row of the table, or one of
    the folders above the library (tools, examples, bench, tests);
  - the table names only its own rows and has no cycle;
  - headers under a detail/ folder are internal: no installed header (a
    header of the library outside detail/) includes one, and nothing outside
    the library and tests/ does;
  - tools/ uses the library and its own cli/ only: nothing under examples/.

Usage: check_layering.py [SOURCE_ROOT]      (exit 0: clean, 1: violations)
       check_layering.py --self-test        (a small tree with one violation
                                             of each kind is caught, each named)
"""
import os
import re
import subprocess
import sys
import tempfile

ABOVE = ("tools", "examples", "bench", "tests")
IGNORED = {"build", "docs", "scripts", "cmake", "shared"}
SOURCE_EXT = (".h", ".cuh", ".cpp", ".cu", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
ZEST = re.compile(r"^zest/([A-Za-z0-9_]+)/(.*)$")


def read_table(root):
    path = os.path.join(root, "docs", "ARCHITECTURE.md")
    text = open(path, encoding="utf-8").read()
    m = re.search(r"<!-- layers:begin -->(.*?)<!-- layers:end -->", text, re.S)
    if not m:
        sys.exit(f"{path}: no <!-- layers:begin --> ... <!-- layers:end --> table")
    deps = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("layer", "") or set(cells[0]) <= set("-: "):
            continue
        below = [] if cells[1] in ("-", "") else [d.strip() for d in cells[1].split(",")]
        deps[cells[0]] = below
    return path, deps


def closures(path, deps):
    errors = []
    for layer, below in deps.items():
        for d in below:
            if d not in deps:
                errors.append(f"{path}: layer '{layer}' is built on '{d}', which is not a row of the table")
    closure = {}

    def visit(layer, stack):
        if layer in closure:
            return closure[layer]
        if layer in stack:
            errors.append(f"{path}: the layers form a cycle: {' -> '.join(stack + [layer])}")
            return set()
        out = set()
        for d in deps.get(layer, []):
            if d in deps:
                out |= {d} | visit(d, stack + [layer])
        closure[layer] = out
        return out

    for layer in deps:
        visit(layer, [])
    return closure, errors


def git_files(root):
    """The files of a git checkout that git does not ignore (tracked, or new
    and not ignored), relative to root; None outside a checkout."""
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    r = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return set(r.stdout.splitlines())


SEEN = None  # git_files(root), set by main: what an ignored folder (a build, the GPU kit) holds is not source


def sources(root, top):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            path = os.path.join(dirpath, f)
            if f.endswith(SOURCE_EXT) and (SEEN is None or os.path.relpath(path, root) in SEEN):
                yield path


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield n, m.group(1), m.group(2)


def self_test():
    table = ("<!-- layers:begin -->\n| layer | built on (direct) |\n|---|---|\n| core | - |\n"
             "| comm | core |\n| engine | comm |\n<!-- layers:end -->\n")
    files = {
        "docs/ARCHITECTURE.md": table,
        "core/a.h": '#include "zest/core/b.h"\n',
        "core/detail/b.h": "",
        "comm/c.cpp": '#include "zest/core/a.h"\n#include "zest/engine/e.h"\n',
        "engine/e.h": '#include "zest/core/a.h"\n#include "zest/comm/detail/x.h"\n',
        "engine/e.cpp": '#include "zest/comm/detail/x.h"\n',
        "tools/t.cpp": '#include "common/report.h"\n#include "cli/cli.h"\n',
        "bench/b.cpp": '#include "zest/comm/detail/x.h"\n',
        "tests/t.cpp": '#include "zest/comm/detail/x.h"\n',
        "newlayer/n.cpp": "",
    }
    expected = [
        "comm/c.cpp:2: comm includes zest/engine/e.h: an edge from comm up to engine",
        "engine/e.h:2: the installed header engine/e.h includes the internal zest/comm/detail/x.h",
        'tools/t.cpp:1: tools/ includes "common/report.h"',
        "bench/b.cpp:1: bench/ includes the internal zest/comm/detail/x.h",
        "newlayer/: a folder of C++ sources that is not a row of the layer table",
        "check_layering: 5 violation(s)",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
                f.write(text)
        r = subprocess.run([sys.executable, __file__, tmp], capture_output=True, text=True)
    missing = [e for e in expected if e not in r.stdout]
    if r.returncode != 1 or missing:
        print(r.stdout)
        print(f"check_layering --self-test: exit {r.returncode} (expected 1); not reported: {missing}")
        return 1
    print("check_layering --self-test: each of the 5 planted violations was named, and nothing else")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    global SEEN
    SEEN = git_files(root)
    table_path, deps = read_table(root)
    closure, errors = closures(os.path.relpath(table_path, root), deps)

    for top in sorted(os.listdir(root)):
        full = os.path.join(root, top)
        if not os.path.isdir(full) or top.startswith(".") or top in IGNORED or top.startswith("build"):
            continue
        if top in deps or top in ABOVE:
            continue
        if any(True for _ in sources(root, top)):
            errors.append(f"{top}/: a folder of C++ sources that is not a row of the layer table in "
                          f"docs/ARCHITECTURE.md: add it, with the layers it is built on")

    edges = 0
    for top in list(deps) + list(ABOVE):
        for path in sources(root, top):
            rel = os.path.relpath(path, root)
            in_detail = "/detail/" in rel
            is_header = rel.endswith((".h", ".cuh"))
            for line, kind, target in includes(path):
                where = f"{rel}:{line}"
                m = ZEST.match(target)
                if not m:
                    if top == "tools" and kind == '"' and not target.startswith("cli/"):
                        errors.append(f"{where}: tools/ includes \"{target}\": a tool uses the library "
                                      f"(zest/...) and tools/cli only, nothing under examples/")
                    continue
                edges += 1
                layer, rest = m.group(1), m.group(2)
                if layer not in deps:
                    if layer != "zest_generated":
                        errors.append(f"{where}: includes {target}, but '{layer}' is not a layer of "
                                      f"docs/ARCHITECTURE.md")
                    continue
                detail = rest.startswith("detail/") or "/detail/" in rest
                if top in deps:
                    allowed = {top} | closure.get(top, set())
                    if layer not in allowed:
                        errors.append(
                            f"{where}: {top} includes {target}: an edge from {top} up to {layer}, which "
                            f"docs/ARCHITECTURE.md does not allow ({top} is built on: "
                            f"{', '.join(sorted(allowed - {top})) or 'nothing'})")
                    if detail and is_header and not in_detail:
                        errors.append(f"{where}: the installed header {rel} includes the internal "
                                      f"{target}: move what it needs out of detail/, or this header into it")
                elif detail and top != "tests":
                    errors.append(f"{where}: {top}/ includes the internal {target}: use the installed "
                                  f"headers (detail/ folders are not installed)")

    for e in errors:
        print(e)
    if errors:
        print(f"check_layering: {len(errors)} violation(s) of docs/ARCHITECTURE.md's layering")
        return 1
    print(f"check_layering: {edges} zest/ include edges of {len(deps)} layers and {', '.join(ABOVE)} "
          f"follow docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
