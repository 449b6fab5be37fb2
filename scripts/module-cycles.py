#!/usr/bin/env python3
"""Print import cycles between the module files of a Rust crate.

    python3 scripts/module-cycles.py cpu-kernels          # a crate directory (its src/)
    python3 scripts/module-cycles.py engine/src           # or its src directory
    python3 scripts/module-cycles.py quant gguf --edges   # several; --edges lists the graph

Every crate root found is analysed on its own: src/lib.rs, src/main.rs and src/bin/*.rs.
The module tree is read from `mod name;` declarations (`#[path]` and inline `mod x { .. }`
blocks are followed); each module file is one node. A file depends on another when it names
a path into it:
  * `use` trees (`use crate::a::{b, c::D}`, `use super::*`, `use child::x`),
  * paths in code (`crate::a::f()`, `$crate::..`, `super::super::x`, `self::x`, and
    `child::x` for a child module of the current one),
  * macro invocations `name!` of a `macro_rules! name` defined in another file (the body's
    paths count for the file that defines the macro).
A path is attributed to the deepest module it names (`crate::x86::cpu::has_avx2` -> x86::cpu,
`crate::QTensor` -> the crate root). Declaring a child (`mod x;`) is not a dependency.
Comments, string and char literals are ignored. Method calls on types from elsewhere
(`Acts::prepare` implemented in another module) are invisible: this is a lexical check.

Output: per crate root the number of modules and edges, the strongly connected components with
more than one module, the number of elementary cycles (counted up to a cap) and the shortest
ones. Exit status 1 if any crate root has a cycle, else 0.
"""

import argparse
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# ---------------------------------------------------------------- lexing

CHAR_LIT = re.compile(r"'(?:\\(?:[nrt\\0'\"]|x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\})|[^\\'\n])'")


def strip(src):
    """Source with comments, strings and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)

    def blank(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
        elif c in "rb" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.compile(r'(?:br|rb|r)(#*)"').match(src, i)
            if m:
                end = src.find('"' + m.group(1), m.end())
                end = n if end < 0 else end + 1 + len(m.group(1))
                out.append(blank(src[i:end]))
                i = end
            elif src.startswith('b"', i) or src.startswith("b'", i):
                out.append(" ")
                i += 1
            else:
                out.append(c)
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(blank(src[i : j + 1]))
            i = j + 1
        elif c == "'":
            m = CHAR_LIT.match(src, i)
            if m:
                out.append(blank(m.group(0)))
                i = m.end()
            else:  # a lifetime or label
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


# ---------------------------------------------------------------- module tree


class Module:
    def __init__(self, path, file, inline_in=None):
        self.path = path  # tuple of names from the crate root
        self.file = file  # the file holding it
        self.inline_in = inline_in  # the file module's path when declared inline
        self.children = {}

    @property
    def file_path(self):
        return self.inline_in if self.inline_in is not None else self.path


MOD_DECL = re.compile(r"(?:#\s*\[[^\]]*\]\s*)*(?:pub\s*(?:\([^)]*\))?\s*)?\bmod\s+(" + IDENT + r")\s*([;{])")
PATH_ATTR = re.compile(r'#\s*\[\s*path\s*=\s*"([^"]*)"\s*\]')


def matching_brace(text, open_pos):
    depth = 0
    for j in range(open_pos, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


class Crate:
    def __init__(self, root_file):
        self.root_file = root_file
        self.modules = {}  # path tuple -> Module
        self.texts = {}  # file module path -> (raw, stripped)
        self.scopes = {}  # file module path -> [(start, end, inline module path)]
        self.missing = []
        self._load(root_file, (), os.path.dirname(root_file), True)

    def _load(self, file, path, child_dir, _is_dir_owner):
        raw = open(file, encoding="utf-8").read()
        text = strip(raw)
        mod = Module(path, file)
        self.modules[path] = mod
        self.texts[path] = (raw, text)
        self.scopes[path] = []
        self._decls(file, raw, text, 0, len(text), path, path, child_dir)

    def _decls(self, file, raw, text, start, end, mod_path, file_mod_path, child_dir):
        i = start
        while True:
            m = MOD_DECL.search(text, i, end)
            if not m:
                return
            name, kind = m.group(1), m.group(2)
            # `#[path]` is a string: read it from the raw text of the attributes.
            attrs = raw[m.start() : m.start(1)]
            pm = PATH_ATTR.search(attrs)
            child = mod_path + (name,)
            if kind == ";":
                if pm:
                    # relative to the declaring file's directory, or inside an inline module
                    # to the directory of that module
                    base = child_dir if mod_path != file_mod_path else os.path.dirname(file)
                    f = os.path.normpath(os.path.join(base, pm.group(1)))
                    sub_dir = os.path.dirname(f)
                else:
                    cand = [os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")]
                    f = next((c for c in cand if os.path.exists(c)), None)
                    sub_dir = os.path.join(child_dir, name)
                if f is None or not os.path.exists(f):
                    self.missing.append("::".join(child))
                else:
                    self.modules[mod_path].children[name] = child
                    self._load(f, child, sub_dir, True)
                i = m.end()
            else:
                close = matching_brace(text, m.end() - 1)
                inner = Module(child, file, inline_in=file_mod_path)
                self.modules[child] = inner
                self.modules[mod_path].children[name] = child
                self.scopes[file_mod_path].append((m.end(), close, child))
                self._decls(file, raw, text, m.end(), close, child, file_mod_path, os.path.join(child_dir, name))
                i = close + 1

    def scope_at(self, file_mod_path, pos):
        """The (possibly inline) module whose body holds `pos`."""
        best = file_mod_path
        best_len = None
        for s, e, p in self.scopes[file_mod_path]:
            if s <= pos < e and (best_len is None or e - s < best_len):
                best, best_len = p, e - s
        return best

    def file_modules(self):
        return [p for p, m in self.modules.items() if m.inline_in is None]


def name_of(path):
    return "crate" if not path else "::".join(path)


# ---------------------------------------------------------------- references


def parse_use_tree(s):
    """Paths of a use tree without its leading `use` and trailing `;` (segments lists)."""
    s = re.sub(r"\s+", " ", s).strip()
    pos = 0
    out = []

    def tree(prefix):
        nonlocal pos
        segs = list(prefix)
        while True:
            while pos < len(s) and s[pos] == " ":
                pos += 1
            if s.startswith("::", pos):
                pos += 2
                continue
            if pos < len(s) and s[pos] == "{":
                pos += 1
                while True:
                    while pos < len(s) and s[pos] in " ,":
                        pos += 1
                    if pos >= len(s) or s[pos] == "}":
                        pos += 1
                        return
                    tree(segs)
            if pos < len(s) and s[pos] == "*":
                pos += 1
                out.append(segs + ["*"])
                return
            m = re.compile(r"\$?" + IDENT).match(s, pos)
            if not m:
                out.append(segs)
                return
            pos = m.end()
            seg = m.group(0)
            if seg == "self" and segs:
                out.append(segs)
            else:
                segs = segs + [seg]
            while pos < len(s) and s[pos] == " ":
                pos += 1
            if s.startswith(" as ", pos - 1) or s.startswith("as ", pos):
                m2 = re.compile(r"as\s+" + IDENT).match(s, pos)
                if m2:
                    pos = m2.end()
            if not s.startswith("::", pos):
                if seg != "self" or not prefix:
                    out.append(segs)
                return

    tree([])
    return [p for p in out if p]


USE_STMT = re.compile(r"(?<![A-Za-z0-9_])use\s+")
CODE_PATH = re.compile(r"(?<![A-Za-z0-9_:$])(\$crate|crate|super|self)((?:\s*::\s*" + IDENT + r")+)")
BARE_PATH = re.compile(r"(?<![A-Za-z0-9_:$.])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)")
MACRO_DEF = re.compile(r"\bmacro_rules\s*!\s*(" + IDENT + ")")
MACRO_USE = re.compile(r"(?<![A-Za-z0-9_:])(" + IDENT + r")\s*!\s*[\(\[\{]")
VIS_IN = re.compile(r"\bpub\s*\(\s*in\s+[^)]*\)")


class Graph:
    def __init__(self, crate):
        self.crate = crate
        self.edges = {}  # (a, b) file module paths -> first reference (file, line, text)
        nodes = crate.file_modules()
        self.nodes = sorted(nodes, key=lambda p: (len(p) > 0, p))
        self.macro_defs = {}
        for p in nodes:
            for m in MACRO_DEF.finditer(crate.texts[p][1]):
                self.macro_defs.setdefault(m.group(1), set()).add(p)
        for p in nodes:
            self._scan(p)

    def resolve(self, scope, segs):
        """File module a path written in `scope` points into, or None (extern / item in scope)."""
        mods = self.crate.modules
        head = segs[0]
        if head in ("crate", "$crate"):
            base, rest = (), segs[1:]
        elif head in ("super", "self"):
            base, k = scope, 0
            while k < len(segs) and segs[k] in ("super", "self"):
                if segs[k] == "super":
                    if not base:
                        return None
                    base = base[:-1]
                k += 1
            rest = segs[k:]
        elif head in mods.get(scope, Module((), "")).children:
            base, rest = scope, segs
        else:
            return None
        cur = base
        for seg in rest:
            nxt = cur + (seg,)
            if nxt in mods:
                cur = nxt
            else:
                break
        return mods[cur].file_path

    def _add(self, a, b, where):
        if a != b and b is not None:
            self.edges.setdefault((a, b), where)

    def _scan(self, p):
        raw, text = self.crate.texts[p]
        file = self.crate.modules[p].file
        rawlines = raw.split("\n")
        text = VIS_IN.sub(lambda m: " " * len(m.group(0)), text)

        def where(pos):
            ln = line_of(text, pos)
            return (file, ln, rawlines[ln - 1].strip())

        # use declarations (blanked afterwards so code paths are not read twice)
        chars = list(text)
        for m in USE_STMT.finditer(text):
            end = text.find(";", m.end())
            if end < 0:
                continue
            scope = self.crate.scope_at(p, m.start())
            for segs in parse_use_tree(text[m.end() : end]):
                if segs and segs[-1] == "*":
                    segs = segs[:-1]
                if segs:
                    self._add(p, self.resolve(scope, segs), where(m.start()))
            for j in range(m.start(), end):
                if chars[j] != "\n":
                    chars[j] = " "
        code = "".join(chars)
        for m in CODE_PATH.finditer(code):
            segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
            self._add(p, self.resolve(self.crate.scope_at(p, m.start()), segs), where(m.start()))
        for m in BARE_PATH.finditer(code):
            if m.group(1) in ("crate", "$crate", "super", "self"):
                continue
            scope = self.crate.scope_at(p, m.start())
            if m.group(1) in self.crate.modules[scope].children:
                segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
                self._add(p, self.resolve(scope, segs), where(m.start()))
        for m in MACRO_USE.finditer(code):
            defs = self.macro_defs.get(m.group(1), set())
            if p in defs or m.group(1) == "macro_rules":
                continue
            for d in sorted(defs):
                self._add(p, d, where(m.start()))

    def succ(self):
        s = {n: [] for n in self.nodes}
        for a, b in sorted(self.edges):
            s[a].append(b)
        return s


def sccs(nodes, succ):
    """Tarjan's strongly connected components."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def elementary_cycles(comp, succ, cap):
    """Elementary cycles inside one SCC (each once, starting at its smallest node), at most cap."""
    order = {v: i for i, v in enumerate(sorted(comp, key=lambda p: (len(p) > 0, p)))}
    cyc = []
    for s in sorted(comp, key=order.get):
        # simple DFS over nodes ordered after s: each cycle is found once from its least node
        stack = [(s, iter(succ[s]))]
        path, on = [s], {s}
        while stack and len(cyc) < cap:
            v, it = stack[-1]
            w = next(it, None)
            if w is None:
                stack.pop()
                on.discard(path.pop())
                continue
            if w not in order or order[w] < order[s]:
                continue
            if w == s:
                cyc.append(list(path))
            elif w not in on:
                path.append(w)
                on.add(w)
                stack.append((w, iter(succ[w])))
        if len(cyc) >= cap:
            break
    return cyc


def roots_of(arg):
    if os.path.isfile(arg):
        return [arg]
    src = arg if os.path.basename(os.path.normpath(arg)) == "src" else os.path.join(arg, "src")
    roots = [os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]
    bindir = os.path.join(src, "bin")
    if os.path.isdir(bindir):
        for f in sorted(os.listdir(bindir)):
            full = os.path.join(bindir, f)
            if f.endswith(".rs"):
                roots.append(full)
            elif os.path.exists(os.path.join(full, "main.rs")):
                roots.append(os.path.join(full, "main.rs"))
    return roots


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("crates", nargs="+", help="crate directories, src directories or root files")
    ap.add_argument("--edges", action="store_true", help="print every dependency edge with its first reference")
    ap.add_argument("--max-cycles", type=int, default=20, help="cycles printed per crate root (shortest first)")
    ap.add_argument("--cap", type=int, default=100000, help="stop counting elementary cycles here")
    args = ap.parse_args()
    any_cycle = False
    for arg in args.crates:
        roots = roots_of(arg)
        if not roots:
            print(f"{arg}: no src/lib.rs, src/main.rs or src/bin/*.rs")
            any_cycle = True
            continue
        for root in roots:
            crate = Crate(root)
            g = Graph(crate)
            succ = g.succ()
            comps = [sorted(c, key=lambda p: (len(p) > 0, p)) for c in sccs(g.nodes, succ) if len(c) > 1]
            cycles = []
            for c in comps:
                cycles += elementary_cycles(c, succ, args.cap - len(cycles))
            capped = len(cycles) >= args.cap
            any_cycle |= bool(cycles)
            print(f"{root}: {len(g.nodes)} modules, {len(g.edges)} edges, "
                  f"{len(comps)} cyclic components, {len(cycles)}{'+' if capped else ''} elementary cycles")
            for m in crate.missing:
                print(f"  (module file not found: {m})")
            for i, c in enumerate(comps, 1):
                print(f"  component {i} ({len(c)} modules): {', '.join(name_of(p) for p in c)}")
            shown = sorted(cycles, key=lambda c: (len(c), [name_of(p) for p in c]))[: args.max_cycles]
            for c in shown:
                print("    " + " -> ".join(name_of(p) for p in c + [c[0]]))
            if len(cycles) > len(shown):
                print(f"    ... {len(cycles) - len(shown)}{'+' if capped else ''} more")
            if args.edges:
                print("  edges:")
                for (a, b), (f, ln, txt) in sorted(g.edges.items(), key=lambda e: (name_of(e[0][0]), name_of(e[0][1]))):
                    print(f"    {name_of(a)} -> {name_of(b)}    {os.path.relpath(f)}:{ln}: {txt[:100]}")
    sys.exit(1 if any_cycle else 0)


if __name__ == "__main__":
    main()
