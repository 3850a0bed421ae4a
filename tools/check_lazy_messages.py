#!/usr/bin/env python3
"""Source rule for the CUDA launchers (kernels/cuda): an argument check must not build its message unless it fails.

`check(cond, comp, "text" + expected_got(...))` builds the std::string on every call, and a launcher runs on every
tick that is not a graph replay (the batched policy's out-of-phase ticks, ops called directly), so it breaks the
no-allocation-after-load contract. Write `if (!(cond)) [[unlikely]] fail(comp, ...)` instead. Exit 1 listing the
offending lines."""
import pathlib
import re
import sys


def call_args(text, start):
    """Top-level argument strings of the call whose '(' is just before `start`, and the index after its ')'."""
    args, cur, depth, i, in_str = [], "", 1, start, False
    while depth:
        ch = text[i]
        if in_str:
            if ch == "\\":
                cur += ch + text[i + 1]
                i += 2
                continue
            in_str = ch != '"'
        elif ch == '"':
            in_str = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if depth == 1 and ch == "," and not in_str:
            args.append(cur)
            cur = ""
        elif depth:
            cur += ch
        i += 1
    return args + [cur], i


def eager(arg):
    return ("+" in arg and '"' in arg) or "expected_got" in arg or "to_string" in arg


def main(root):
    bad = []
    for path in sorted(pathlib.Path(root, "kernels", "cuda").glob("*.cu*")):
        text = path.read_text()
        for m in re.finditer(r"(?<![\w:.])check\(", text):
            args, _ = call_args(text, m.end())
            if any(eager(a) for a in args[1:]):
                bad.append(f"{path.relative_to(root)}:{text.count(chr(10), 0, m.start()) + 1}: check() builds its message eagerly")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent))
