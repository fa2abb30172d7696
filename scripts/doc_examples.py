#!/usr/bin/env python3
"""Extracts the C++ examples of the Markdown documentation (README.md and
docs/*.md) and of the library's header comments into translation units that
tests/doc_examples builds and runs (ctest: doc_examples). docs/BUILD.md's
"Code examples in the docs" says how an example is written; in short:

  README.md, docs/*.md: every ```cpp block; words after `cpp` are options.
  headers:   an indented comment block whose first line is `// zest-example`
             (or `// zest-example: options`); its lines, less the marker's
             indentation, are the code.

Options: prelude=NAME[,NAME] (declarations from tests/doc_examples/preludes.inc
the block may use), needs=torch|cuda|mpi (built only where that layer is), run
(the test also runs it: quick, deterministic, writes only to its working
directory). A block with `int main(` is a program (renamed, linked, run when
marked); any other block is the body of a function, compiled and linked.

Every code line keeps its origin through #line, so a compiler error names
the Markdown file or the header and the block's line. Comment lines in the
scanned headers that look like code but are in no marked block are an error
here, so an example cannot silently escape the test.

Programs are also written one to a file, with only their own #includes (and
their preludes'), and compiled alone (syntax only) by the test, so that a
program copied out of the docs has every include it needs.

Usage: doc_examples.py SOURCE_DIR OUT_DIR FEATURE...   (features: torch cuda mpi)
  Writes OUT_DIR/host.cpp, torch.cpp (with torch), cuda.cu (with cuda),
  main.cpp, and OUT_DIR/alone/*.cpp; a file is rewritten only when its text
  changes.
doc_examples.py --alone BUILD_DIR OUT_DIR
  Compiles each OUT_DIR/alone/*.cpp with the flags of its group's unit in
  BUILD_DIR/compile_commands.json.
"""
import json
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
import os
import re
import sys

HEADER_DIRS = ["core", "memory", "nvme", "comm", "launch", "mesh", "optim", "config", "engine", "checkpoint", "hf",
               "estimate", "data", "pipeline", "torch"]
KNOWN_NEEDS = {"torch", "cuda", "mpi"}
MARKER = re.compile(r"^(\s*)//(\s+)// zest-example(?::\s*(.*?))?\s*$")
COMMENT = re.compile(r"^\s*//(.*)$")
FENCE = re.compile(r"^```(\S*)\s*(.*?)\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s*(<[^>]*>|"[^"]*")\s*(//.*)?$')
MAIN = re.compile(r"\bint\s+main\s*\(")


class Block:
    def __init__(self, path, line, code_lines, options, header):
        self.path = path            # relative to the source root
        self.line = line            # 1-based line of the first code line
        self.code = code_lines      # list of str
        self.header = header        # the header's include path, or None (a Markdown file)
        self.preludes = []
        self.needs = set()
        self.run = False
        for opt in options.split():
            if opt.startswith("prelude="):
                self.preludes += [p for p in opt[len("prelude="):].split(",") if p]
            elif opt.startswith("needs="):
                self.needs |= {n for n in opt[len("needs="):].split(",") if n}
            elif opt == "run":
                self.run = True
            else:
                fail(path, line - 1, f"unknown example option '{opt}' (prelude=NAME, needs=torch|cuda|mpi, run)")
        for n in self.needs - KNOWN_NEEDS:
            fail(path, line - 1, f"unknown needs={n} (torch, cuda or mpi)")
        if header and header.startswith("zest/torch/"):
            self.needs.add("torch")
        self.program = any(MAIN.search(l) for l in code_lines)
        if self.run and self.preludes and not self.program:
            # A fragment's preludes bind names to objects that do not exist.
            fail(path, line - 1, "`run` is for programs and fragments without a prelude")

    def where(self):
        return f"{self.path}:{self.line}"


errors = []


def fail(path, line, msg):
    errors.append(f"{path}:{line}: {msg}")


def markdown_files(root):
    """README.md, then docs/*.md in name order (paths relative to root)."""
    files = ["README.md"]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += ["docs/" + f for f in sorted(os.listdir(docs))
                  if f.endswith(".md") and os.path.isfile(os.path.join(docs, f))]
    return files


def markdown_blocks(root, path):
    """Every ```cpp block of the Markdown file `path` (relative to root)."""
    lines = open(os.path.join(root, path), encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, options, start = m.group(1), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            fail(path, start + 1, "code fence never closed")
        if lang in ("cpp", "c++", "cxx"):
            blocks.append(Block(path, start + 2, body, options, None))
        i += 1
    return blocks


# A comment line that reads as a C++ statement or declaration (after its own
# trailing comment is removed): a call on an object, a ZEST_ macro, a
# zest:: name, or a declaration of a capitalised type or with auto/const.
LOOKS_LIKE_CODE = [
    re.compile(r"\bzest::\w"),
    re.compile(r"^[\w\]\)]+(\.|->)\w+.*\(.*\);$"),
    re.compile(r"^[a-z_][\w:]*\(.*\);$"),
    re.compile(r"^ZEST_[A-Z_]+\(.*\);"),
    re.compile(r"^(auto|const|int|\w+::[\w:<>]+|[A-Z]\w*(<[^>]*>)?)\s+\w+\s*(=|\(|\{|;)"),
]


def looks_like_code(text):
    code = re.sub(r"\s//.*$", "", text).strip()
    if code.startswith("ZEST_") and re.match(r"^ZEST_[A-Z_]+\(.*\);", code):
        return True  # a check macro, perhaps followed by words about it
    return code.endswith((";", "{")) and any(p.search(code) for p in LOOKS_LIKE_CODE)


def header_blocks(root, rel):
    lines = open(os.path.join(root, rel), encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    include = "zest/" + rel
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            c = COMMENT.match(lines[i])
            if c and c.group(1).startswith("  ") and looks_like_code(c.group(1)):
                fail(rel, i + 1, "a comment line that looks like code outside a `// zest-example` block: "
                     "mark its block as an example (docs/BUILD.md, Code examples in the docs) or reword it")
            i += 1
            continue
        lead, indent, options = m.group(1), m.group(2), m.group(3) or ""
        start, i = i, i + 1
        body = []
        while i < len(lines):
            c = COMMENT.match(lines[i])
            if not c or not lines[i].startswith(lead + "//" + indent) or not c.group(1).strip():
                break
            body.append(c.group(1)[len(indent):])
            i += 1
        if not body:
            fail(rel, start + 1, "a `zest-example` marker with no indented code lines after it")
            continue
        blocks.append(Block(rel, start + 2, body, options, include))
    return blocks


def read_preludes(root):
    path = "tests/doc_examples/preludes.inc"
    preludes, name, part = {}, None, None
    for n, line in enumerate(open(os.path.join(root, path), encoding="utf-8").read().split("\n"), 1):
        m = re.match(r"^// == prelude: (\w+)\s*$", line)
        if m:
            name, part = m.group(1), "scope"
            preludes[name] = {"scope": [], "body": [], "line": n}
        elif line.strip() == "// -- body":
            part = "body"
        elif name:
            preludes[name][part].append(line)
    return preludes


def emit_block(b, idx, preludes, root, out):
    """Appends block b's code to out (a list of lines) in namespace doc_N."""
    hoisted, scope, body_pre = [], [], []
    if b.header:
        hoisted.append(f"#include <{b.header}>")
    for p in b.preludes:
        if p not in preludes:
            fail(b.path, b.line - 1, f"unknown prelude '{p}' (tests/doc_examples/preludes.inc has "
                 f"{', '.join(sorted(preludes))})")
            continue
        for l in preludes[p]["scope"]:
            (hoisted if INCLUDE.match(l) else scope).append(l)
        body_pre += preludes[p]["body"]
    code = []
    for l in b.code:
        if INCLUDE.match(l):
            hoisted.append(l.strip())
            code.append("")  # keeps the #line mapping
        else:
            code.append(l)
    src = f'#line {b.line} "{b.path}"'
    out.append(f"// {b.where()}")
    out.append(f"namespace doc_{idx} {{")
    if b.header:
        out.append("using namespace zest;  // header examples read as if inside namespace zest")
    out += scope
    if b.program:
        out.append(src)
        # auto: a main that ends without `return` returns void, as if it returned 0.
        out += [MAIN.sub(f"auto main_doc_{idx}(", l) for l in code]
    else:
        out.append("[[maybe_unused]] void example() {")
        out += body_pre
        out.append(src)
        out += code
        out.append("}")
    out.append(f"}}  // namespace doc_{idx}")
    return hoisted


def translation_unit(blocks, start_idx, preludes, root, fn):
    hoisted, body, runs = ['#include "doc_example_support.h"'], [], []
    for k, b in enumerate(blocks):
        idx = start_idx + k
        for h in emit_block(b, idx, preludes, root, body):
            if h not in hoisted:
                hoisted.append(h)
        if b.run:
            call = f"doc_{idx}::main_doc_{idx}" if b.program else f"doc_{idx}::example"
            runs.append(f'  r.run("{b.where()}", [] {{ return zest_doc::result_of({call}); }});')
    text = "\n".join(hoisted) + "\n\n" + "\n".join(body) + "\n\n"
    text += f"void {fn}(zest_doc::Runner& r) {{\n" + "\n".join(runs) + ("\n" if runs else "") + "  (void)r;\n}\n"
    return text


def standalone(b, preludes):
    """Block b (a program) as a file of its own: its includes and its
    preludes' only, then its code at its own lines."""
    lines = ['#include "doc_example_support.h"']
    if b.header:
        lines.append(f"#include <{b.header}>")
    for p in b.preludes:
        lines += preludes[p]["scope"] if p in preludes else []
    lines.append(f'#line {b.line} "{b.path}"')
    lines += b.code
    return "\n".join(lines) + "\n"


def compile_alone(build_dir, out_dir):
    commands = json.load(open(os.path.join(build_dir, "compile_commands.json"), encoding="utf-8"))
    alone = os.path.abspath(os.path.join(out_dir, "alone"))
    jobs = []
    for name in sorted(os.listdir(alone)):
        group = name.split("-")[0]  # host-..., torch-...
        unit = os.path.join(out_dir, f"{group}.cpp")
        entry = next((c for c in commands if os.path.samefile(c["file"], unit)), None) \
            if os.path.exists(unit) else None
        if entry is None:
            sys.exit(f"doc_examples: no compile command for {unit} in compile_commands.json")
        args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
        cmd, skip = [], False
        for i, a in enumerate(args):
            if skip:
                skip = False
            elif a in ("-o", "-MF", "-MT", "-c"):
                skip = True
            elif a == "-include" and i + 1 < len(args) and args[i + 1].endswith("cmake_pch.hxx"):
                # The unit's precompiled torch.h (cmake/ZestTorchPch.cmake) would
                # stand in for an #include the program forgot.
                skip = True
            elif a != "-MD" and a != entry["file"] and a != "-Winvalid-pch":
                cmd.append(a)
        jobs.append((name, cmd + ["-fsyntax-only", os.path.join(alone, name)], entry["directory"]))

    def run(job):
        name, cmd, cwd = job
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        return name, r.returncode, r.stdout + r.stderr

    failed = 0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for name, rc, output in pool.map(run, jobs):
            print(f"alone {name}: {'ok' if rc == 0 else 'does NOT compile on its own'}")
            if rc != 0:
                failed += 1
                sys.stdout.write(output)
    if failed:
        print(f"doc_examples: {failed} program(s) do not compile on their own: an #include is missing "
              "(the errors above name the block's file and line)")
    return 1 if failed else 0


def write_if_changed(path, text):
    if os.path.exists(path) and open(path, encoding="utf-8").read() == text:
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if sys.argv[1] == "--alone":
        sys.exit(compile_alone(sys.argv[2], sys.argv[3]))
    root, out_dir, features = sys.argv[1], sys.argv[2], set(sys.argv[3:])
    blocks = []
    for md in markdown_files(root):
        blocks += markdown_blocks(root, md)
    for d in HEADER_DIRS:
        top = os.path.join(root, d)
        if not os.path.isdir(top):
            continue
        for dirpath, _, files in sorted(os.walk(top)):
            for f in sorted(files):
                if f.endswith((".h", ".cuh")):
                    blocks += header_blocks(root, os.path.relpath(os.path.join(dirpath, f), root))
    preludes = read_preludes(root)

    groups = {"host": [], "torch": [], "cuda": []}
    skipped = []
    for b in blocks:
        missing = b.needs - features
        if missing:
            skipped.append(f"{b.where()} (needs {', '.join(sorted(missing))}, not in this build)")
        elif "cuda" in b.needs:
            groups["cuda"].append(b)
        elif "torch" in b.needs:
            groups["torch"].append(b)
        else:
            groups["host"].append(b)

    units, idx = {}, 0
    for g, ext in (("host", "cpp"), ("torch", "cpp"), ("cuda", "cu")):
        if g == "host" or g in features:
            units[f"{g}.{ext}"] = translation_unit(groups[g], idx, preludes, root, f"run_{g}")
            idx += len(groups[g])
    if errors:
        sys.stderr.write("doc_examples: " + "\ndoc_examples: ".join(errors) + "\n")
        sys.exit(1)

    os.makedirs(os.path.join(out_dir, "alone"), exist_ok=True)
    for name, text in units.items():
        write_if_changed(os.path.join(out_dir, name), text)
    wanted = set()
    for g in ("host", "torch"):
        for b in groups[g] if (g == "host" or g in features) else []:
            if b.program:
                name = f"{g}-" + re.sub(r"[^\w]", "_", b.where()) + ".cpp"
                wanted.add(name)
                write_if_changed(os.path.join(out_dir, "alone", name), standalone(b, preludes))
    for name in os.listdir(os.path.join(out_dir, "alone")):
        if name not in wanted:
            os.remove(os.path.join(out_dir, "alone", name))
    compiled = sum(len(groups[g]) for g in groups if g == "host" or g in features)
    main_cpp = ['#include "doc_example_support.h"', ""]
    main_cpp += [f"void run_{g}(zest_doc::Runner& r);" for g in groups if g == "host" or g in features]
    main_cpp += ["", "int main() {", "  zest_doc::Runner r;"]
    main_cpp += [f"  run_{g}(r);" for g in groups if g == "host" or g in features]
    main_cpp += [f'  r.note_skipped("{s}");' for s in skipped]
    main_cpp += [f"  return r.finish({compiled});", "}", ""]
    write_if_changed(os.path.join(out_dir, "main.cpp"), "\n".join(main_cpp))


if __name__ == "__main__":
    main()
