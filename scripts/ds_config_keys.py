#!/usr/bin/env python3
"""The config keys DeepSpeed accepts, per section, read from its source.

Usage: scripts/ds_config_keys.py DEEPSPEED_CHECKOUT [--header OUT.h]

DEEPSPEED_CHECKOUT is a work tree, or a bare git directory (its HEAD is
read). Mechanically, with Python's ast (no import of DeepSpeed):
  - the top-level keys: every string key DeepSpeedConfig (runtime/config.py)
    reads from its dict (param_dict[K], param_dict.get(K), K in param_dict,
    get_scalar_param(param_dict, K, ...)), itself or in the functions and
    classes it hands the whole dict to, with the ALL_CAPS string constants
    of the package resolved (runtime/constants.py's first);
  - the sections DeepSpeed validates: the fields (and their aliases) of each
    DeepSpeedConfigModel subclass, placed under the top-level key of the
    function that builds the model from param_dict, and nested where a
    field's annotation names another model.
Prints "section: key key ..." lines, or writes config/ds_schema_keys.h
(the list the config reader's tests hold ZEST to) with the commit read.
"""
import ast
import os
import subprocess
import sys

AREAS = ("deepspeed/runtime", "deepspeed/monitor", "deepspeed/profiling", "deepspeed/autotuning",
         "deepspeed/compression", "deepspeed/elasticity", "deepspeed/comm", "deepspeed/nebula",
         "deepspeed/datastates", "deepspeed/checkpoint", "deepspeed/utils", "deepspeed/compile")


class Source:
    """Files of the checkout, from a work tree or a bare git directory."""

    def __init__(self, path):
        self.path = path
        self.bare = not os.path.isdir(os.path.join(path, "deepspeed"))

    def git(self, *args):
        return subprocess.run(["git", "--git-dir", self.path, *args], check=True, capture_output=True,
                              text=True).stdout

    def commit(self):
        if self.bare:
            return self.git("rev-parse", "HEAD").strip()
        return subprocess.run(["git", "-C", self.path, "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()

    def files(self):
        if self.bare:
            names = self.git("ls-tree", "-r", "--name-only", "HEAD", "deepspeed").split("\n")
        else:
            names = []
            for root, _, fs in os.walk(os.path.join(self.path, "deepspeed")):
                names += [os.path.relpath(os.path.join(root, f), self.path) for f in fs]
        return sorted(n for n in names if n.endswith(".py"))

    def read(self, name):
        if self.bare:
            return self.git("show", "HEAD:" + name)
        with open(os.path.join(self.path, name), encoding="utf-8") as f:
            return f.read()


def constants(trees):
    """NAME -> string: within a module the last assignment (constants.py
    assigns some names a format text first), across modules
    runtime/constants.py's first."""
    out = {}
    order = sorted(trees, key=lambda n: n != "deepspeed/runtime/constants.py")
    for name in order:
        mine = {}
        for node in trees[name].body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(
                    node.value.value, str):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.isupper():
                        mine[t.id] = node.value.value
        for k, v in mine.items():
            out.setdefault(k, v)
    return out


def key_of(node, consts):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def bound(fn, call, consts):
    """consts, plus fn's parameters bound to the strings the call (or the
    parameter's default) passes: get_communication_data_type(param_dict,
    SEQ_PARALLEL_COMMUNICATION_DATA_TYPE, ...) reads that key."""
    if not isinstance(fn, ast.FunctionDef):
        return consts
    out = dict(consts)
    params = [a.arg for a in fn.args.args]
    for name, default in zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults):
        if key_of(default, consts):
            out[name] = key_of(default, consts)
    for name, arg in zip(params, call.args):
        if key_of(arg, consts):
            out[name] = key_of(arg, consts)
    for kw in call.keywords:
        if kw.arg and key_of(kw.value, consts):
            out[kw.arg] = key_of(kw.value, consts)
    return out


def is_param_dict(node):
    if isinstance(node, ast.Name):
        return node.id == "param_dict"
    return isinstance(node, ast.Attribute) and node.attr == "_param_dict"


def param_dict_keys(node, consts):
    """The keys read from param_dict inside `node`."""
    keys = set()
    for n in ast.walk(node):
        k = None
        if isinstance(n, ast.Subscript) and is_param_dict(n.value):
            k = key_of(n.slice, consts)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and is_param_dict(
                n.func.value) and n.func.attr == "get" and n.args:
            k = key_of(n.args[0], consts)
        elif isinstance(n, ast.Compare) and len(n.comparators) == 1 and is_param_dict(n.comparators[0]):
            k = key_of(n.left, consts)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in (
                "get_scalar_param", "get_dict_param", "get_list_param") and len(n.args) >= 2 and is_param_dict(
                    n.args[0]):
            k = key_of(n.args[1], consts)
        if k:
            keys.add(k)
        # {key: param_dict.get(key, {}) for key in (A, B)}
        if isinstance(n, (ast.DictComp, ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            uses = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and is_param_dict(c.func.value)
                       for c in ast.walk(n))
            for gen in n.generators:
                if uses and isinstance(gen.iter, (ast.Tuple, ast.List)):
                    keys |= {k for k in (key_of(e, consts) for e in gen.iter.elts) if k}
    return keys


def nested_key(fn, consts):
    """K2 when `fn` reads param_dict[K][K2] (one such key), else None."""
    found = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Subscript) and is_param_dict(n.value.value):
            k2 = key_of(n.slice, consts)
            if k2:
                found.add(k2)
    return next(iter(found)) if len(found) == 1 else None


def models(trees):
    """DeepSpeedConfigModel subclasses: name -> (fields with aliases, {field: nested model})."""
    classes = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    is_model = {}

    def model(name, seen=()):
        if name in is_model:
            return is_model[name]
        node = classes.get(name)
        ok = False
        if node is not None and name not in seen:
            for b in node.bases:
                base = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                if base == "DeepSpeedConfigModel" or model(base, seen + (name, )):
                    ok = True
        is_model[name] = ok
        return ok

    out = {}
    for name, node in classes.items():
        if name == "DeepSpeedConfigModel" or not model(name):
            continue
        fields, nested = set(), {}
        # Inherited fields first.
        for b in node.bases:
            base = b.id if isinstance(b, ast.Name) else ""
            if base in classes and model(base):
                for item in classes[base].body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        fields.add(item.target.id)
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            field = item.target.id
            if field.startswith("_") or field == "model_config":
                continue
            fields.add(field)
            if isinstance(item.value, ast.Call):
                for kw in item.value.keywords:
                    if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                        fields.add(kw.value.value)
            for n in ast.walk(item.annotation):
                if isinstance(n, ast.Name) and n.id in classes and model(n.id):
                    nested[field] = n.id
        out[name] = (fields, nested)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    src = Source(sys.argv[1])
    trees = {}
    for name in src.files():
        if name.startswith(AREAS) or name == "deepspeed/runtime/config.py":
            try:
                trees[name] = ast.parse(src.read(name))
            except SyntaxError:
                continue
    consts = constants(trees)
    sections = {}
    mods = models(trees)
    defs = {}
    for tree in trees.values():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.ClassDef)):
                defs.setdefault(fn.name, fn)
    config_class = defs["DeepSpeedConfig"]
    top = param_dict_keys(config_class, consts)
    # What DeepSpeedConfig hands the whole dict to, and what those hand it
    # to in turn (two levels cover every reader of it).
    callees = []
    frontier = [config_class]
    for _ in range(2):
        found = []
        for caller in frontier:
            for n in ast.walk(caller):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs and any(
                        is_param_dict(a) for a in n.args) and defs[n.func.id] is not caller:
                    fn = defs[n.func.id]
                    top |= param_dict_keys(fn, bound(fn, n, consts))
                    found.append(fn)
        callees += found
        frontier = found
    for fn in callees + [f for f in defs.values() if isinstance(f, ast.FunctionDef)]:
        if True:
            keys = param_dict_keys(fn, consts)
            if isinstance(fn, ast.FunctionDef) and keys:
                # One model built from the key (or from its old name too:
                # get_bfloat16_config reads "bf16" or "bfloat16").
                built = {n.func.id for n in ast.walk(fn)
                         if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in mods}
                if len(built) == 1 and (len(keys) == 1 or (len(keys) == 2 and fn.name.startswith("get_"))):
                    # Built from a dict one level down (get_timers_config:
                    # param_dict["timers"]["throughput"]): that path.
                    inner = nested_key(fn, consts)
                    for key in sorted(keys):
                        path = key + "." + inner if inner and len(keys) == 1 else key
                        sections.setdefault(path, next(iter(built)))
    # Models built inline in DeepSpeedConfig._initialize_params: Model(**param_dict.get(K, {})).
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in mods:
                keys = param_dict_keys(n, consts)
                if len(keys) == 1:
                    sections.setdefault(next(iter(keys)), n.func.id)
    listing = {"": sorted(top)}

    def add(path, model, depth=0):
        fields, nested = mods[model]
        listing[path] = sorted(fields)
        for field, sub in nested.items():
            if depth < 4:
                add(path + "." + field, sub, depth + 1)

    for key, model in sections.items():
        add(key, model)
    commit = src.commit()
    if "--header" in sys.argv:
        write_header(sys.argv[sys.argv.index("--header") + 1], commit, listing)
    else:
        print("# DeepSpeed", commit)
        for path in sorted(listing):
            print((path or "(top level)") + ":", " ".join(listing[path]))


def write_header(out, commit, listing):
    lines = [
        "// Generated by scripts/ds_config_keys.py from DeepSpeed's source at", f"// commit {commit}:",
        "// the keys DeepSpeed's config accepts, per section (\"\" is the top level),",
        "// each of which the config reader must honour, note as ignored with the",
        "// reason, or refuse by name (tests/config/test_ds_schema.cpp holds it to",
        "// that). Regenerate with a newer checkout; do not edit by hand.", "#pragma once", "",
        "#include <initializer_list>", "", "namespace zest::config_detail {", "",
        f"inline constexpr const char* kDeepSpeedSchemaCommit = \"{commit}\";", "", "struct DsSchemaSection {",
        "  const char* path;", "  std::initializer_list<const char*> keys;", "};", "",
        "inline const DsSchemaSection kDeepSpeedSchema[] = {"
    ]
    for path in sorted(listing):
        line = f'    {{"{path}", {{'
        for i, k in enumerate(listing[path]):
            item = f'"{k}"' + (", " if i + 1 < len(listing[path]) else "}},")
            if len(line) + len(item.rstrip()) > 118:
                lines.append(line.rstrip())
                line = "        "
            line += item
        lines.append(line)
    lines += ["};", "", "}  // namespace zest::config_detail", ""]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
