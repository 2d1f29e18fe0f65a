#!/usr/bin/env python3
"""Checks the shape of the product code (the layered packages and definitions.py): no function
longer than 50 lines, none with more than 7 parameters (`self` and `cls` not counted), and no block
of six or more lines repeated elsewhere, by text or by shape; and the README at the root at most
250 lines long.

    python scripts/check_shape.py [--root DIR]

By text: six consecutive code lines (blank lines, comments, docstrings and imports left out) that
are the same elsewhere, indentation aside. By shape: consecutive statements of one body spanning six
lines or more whose syntax trees are the same elsewhere once every variable is read as N and every
literal as L (a copy with its variables renamed; attribute, keyword and called names still count);
runs of field declarations alone (`name: type = value`) are data, not code, and are left out.
Two occurrences that overlap are one region, not a repeat; overlapping repeats of the same places
are reported once, as their widest regions. Prints each finding with
file:line and exits 1 if there is any. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import copy
import io
import keyword
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["resources", "spark_ops", "photon_assets", "sensors", "photon"]
MAX_LINES, MAX_PARAMETERS, BLOCK = 50, 7, 6
README_MAX_LINES = 250


def product_files(root: Path) -> list[Path]:
    files = [path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))]
    return files + ([root / "definitions.py"] if (root / "definitions.py").is_file() else [])


def functions(path: Path, tree: ast.AST, root: Path) -> list[tuple[str, int, int]]:
    """(file:line name, lines, parameters) of every function and method."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            count = len(names) + bool(args.vararg) + bool(args.kwarg) - (names[:1] in (["self"], ["cls"]))
            where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
            found.append((where, node.end_lineno - node.lineno + 1, count))
    return found


def skipped_lines(tree: ast.AST) -> set[int]:
    """Lines of docstrings and imports."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines.update(range(node.lineno, node.end_lineno + 1))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_lines(source: str, tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line number, text, shape) of each code line."""
    skipped = skipped_lines(tree)
    text: dict[int, list[str]] = defaultdict(list)
    shape: dict[int, list[str]] = defaultdict(list)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                          tokenize.ENDMARKER) or token.start[0] in skipped:
            continue
        line = token.start[0]
        text[line].append(token.string)
        if token.type == tokenize.NAME and not keyword.iskeyword(token.string):
            shape[line].append("N")
        elif token.type in (tokenize.NUMBER, tokenize.STRING) or token.type == getattr(tokenize, "FSTRING_START", -1):
            shape[line].append("L")
        else:
            shape[line].append(token.string)
    return [(n, " ".join(text[n]), " ".join(shape[n])) for n in sorted(text)]


class _Shape(ast.NodeTransformer):
    """A statement with its variables read as N and its literals as L."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id="N", ctx=node.ctx)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.arg(arg="N", annotation=self.visit(node.annotation) if node.annotation else None)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value="L")


def declaration(statement: ast.stmt) -> bool:
    """A field or a constant: `name: type [= value]`, `NAME = literal`."""
    return isinstance(statement, ast.AnnAssign) or (
        isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant))


def shape_of(statement: ast.stmt) -> str:
    """The statement's syntax tree with its variables and literals read as N and L."""
    return ast.dump(_Shape().visit(copy.deepcopy(statement)))


def statement_blocks(tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, shape) of each shortest run of consecutive statements of a body that
    spans six lines or more."""
    blocks = []
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            statements = [b for b in body if not isinstance(b, (ast.Import, ast.ImportFrom))
                          and not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            shapes = [shape_of(b) for b in statements]
            for i in range(len(statements)):
                for j in range(i, len(statements)):
                    if statements[j].end_lineno - statements[i].lineno + 1 >= BLOCK:
                        if all(declaration(b) for b in statements[i:j + 1]):
                            break  # fields declared alike (a settings class, a dataclass) are data
                        blocks.append((statements[i].lineno, statements[j].end_lineno, "\n".join(shapes[i:j + 1])))
                        break
    return blocks


def repeats(files: list[Path], root: Path) -> list[str]:
    seen: dict[tuple[str, str], list[tuple[str, int, int]]] = defaultdict(list)
    for path in files:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        name = str(path.relative_to(root))
        lines = code_lines(source, tree)
        for i in range(len(lines) - BLOCK + 1):
            window = lines[i:i + BLOCK]
            seen[("text", "\n".join(t for _, t, _ in window))].append((name, window[0][0], window[-1][0]))
        for first, last, shape in statement_blocks(tree):
            seen[("shape", shape)].append((name, first, last))
    # Each repeat as its places; a repeat one window further on, of the same files, widens the last.
    regions: list[list[list]] = []  # [[file, first, last], ...] per repeat
    for (kind, _), places in sorted(seen.items(), key=lambda item: sorted(p[:2] for p in item[1])):
        distinct: list[tuple[str, int, int]] = []
        for place in sorted(places, key=lambda p: p[:2]):  # occurrences overlapping an earlier one: one region
            if not any(p[0] == place[0] and p[1] <= place[2] and place[1] <= p[2] for p in distinct):
                distinct.append(place)
        if len(distinct) < 2:
            continue
        for region in regions:
            if len(region) - 1 == len(distinct) and all(r[0] == d[0] and d[1] <= r[2] + 1 and r[1] <= d[2]
                                                    for r, d in zip(region, distinct)):
                for r, d in zip(region, distinct):
                    r[1], r[2] = min(r[1], d[1]), max(r[2], d[2])
                break
        else:
            regions.append([[*d] for d in distinct] + [[kind]])
    return [f"repeated by {region[-1][0]}: " + ", ".join(f"{f}:{a}-{b}" for f, a, b in region[:-1])
            for region in regions]


def readme_problems(root: Path) -> list[str]:
    """The README at the root if it is over README_MAX_LINES lines (none there: nothing to report)."""
    readme = root / "README.md"
    if not readme.is_file():
        return []
    lines = len(readme.read_text(encoding="utf-8").splitlines())
    return [f"README.md: {lines} lines (at most {README_MAX_LINES})"] if lines > README_MAX_LINES else []


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--root", type=Path, default=ROOT)
    root = options.parse_args().root.resolve()
    files = product_files(root)
    problems = []
    all_functions = [f for path in files for f in functions(path, ast.parse(path.read_text(encoding="utf-8")), root)]
    problems += [f"{where}: {lines} lines (at most {MAX_LINES})" for where, lines, _ in all_functions if lines > MAX_LINES]
    problems += [f"{where}: {count} parameters (at most {MAX_PARAMETERS})"
                 for where, _, count in all_functions if count > MAX_PARAMETERS]
    problems += repeats(files, root)
    problems += readme_problems(root)
    for problem in problems:
        print(problem)
    longest = max(all_functions, key=lambda f: f[1])
    most = max(all_functions, key=lambda f: f[2])
    print(f"{'FAIL' if problems else 'OK'}: {len(files)} files, {len(all_functions)} functions; longest {longest[1]} lines"
          f" ({longest[0]}), most parameters {most[2]} ({most[0]}); {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
