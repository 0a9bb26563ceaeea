#!/usr/bin/env python3
"""The Unity package as each player platform compiles it, checked without Unity.

1. Source: every P/Invoke whose library is "__Internal" is compiled only into mobile or web
   players (behind their `#if`), never into a desktop player, an Editor or the test build.
   IL2CPP turns "__Internal" into a direct reference to the C symbol, and a Windows player then
   fails to link (LNK2019: MSVC's CRT has no `kill` or `waitpid`). Each .cs file of the package
   is run through a C# preprocessor under the defines of every desktop player, every Editor
   (whatever its build target) and the package's own test build; a P/Invoke naming "__Internal"
   (directly or through a `const string`) in any of them fails.
2. Compile: the Runtime (with the UnityEngine stub) under each player's defines with mono's
   `mcs -langversion:7.2`, warnings as errors; the Editor code and the sample for a Windows
   Editor.
3. Assembly: the compiled players' P/Invokes, read back with ikdasm: the Windows player's
   process checks call kernel32 and nothing in it names "__Internal"; macOS calls libSystem,
   Linux libc; only the iOS player names "__Internal"; WebGL has no process checks at all.

Usage: platform_checks.py BUILD_DIR (from the repository root). Prints one line per check and
"platform checks: N passed, N failed" last; exits 1 on any failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

PKG = Path("unity_plugin")
STUB = Path("tests/csharp/UnityEngineStub.cs")
EDITOR_STUB = Path("tests/csharp/UnityEditorStub.cs")
MCS = ["mcs", "-langversion:7.2", "-warnaserror+", "-nologo"]

# Unity's scripting defines per target (the platform ones that matter to #if; ENABLE_IL2CPP or
# ENABLE_MONO for the backend). An Editor defines its own OS and the active build target's.
PLAYERS = {
    "Windows player (IL2CPP)": {"UNITY_STANDALONE", "UNITY_STANDALONE_WIN", "ENABLE_IL2CPP"},
    "Windows player (Mono)": {"UNITY_STANDALONE", "UNITY_STANDALONE_WIN", "ENABLE_MONO"},
    "macOS player (IL2CPP)": {"UNITY_STANDALONE", "UNITY_STANDALONE_OSX", "ENABLE_IL2CPP"},
    "Linux player (IL2CPP)": {"UNITY_STANDALONE", "UNITY_STANDALONE_LINUX", "ENABLE_IL2CPP"},
}
EDITORS = {
    f"{os_name} Editor, {target} target": {
        "UNITY_EDITOR",
        f"UNITY_EDITOR_{os_define}",
        "ENABLE_MONO",
        *defines,
    }
    for os_name, os_define in (("Windows", "WIN"), ("macOS", "OSX"), ("Linux", "LINUX"))
    for target, defines in (
        ("own", {"UNITY_STANDALONE", f"UNITY_STANDALONE_{os_define}"}),
        ("Windows", {"UNITY_STANDALONE", "UNITY_STANDALONE_WIN"}),
        ("iOS", {"UNITY_IOS"}),
        ("WebGL", {"UNITY_WEBGL"}),
    )
}
WHERE_INTERNAL_MUST_NOT_BE = {"test build (no Unity defines)": set(), **PLAYERS, **EDITORS}


# ---- a C# preprocessor: #if/#elif/#else/#endif, #define/#undef ----------------------------

_TOKEN = re.compile(r"\s*(\|\||&&|==|!=|!|\(|\)|[A-Za-z_][A-Za-z0-9_]*)")


def _condition(text: str, symbols: set[str]) -> bool:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot read #if condition {text!r}")
        tokens.append(m.group(1))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    at = 0

    def peek() -> str | None:
        return tokens[at] if at < len(tokens) else None

    def take() -> str:
        nonlocal at
        at += 1
        return tokens[at - 1]

    # C#: || below && below == != below unary !
    def disjunction() -> bool:
        value = conjunction()
        while peek() == "||":
            take()
            value = conjunction() or value
        return value

    def conjunction() -> bool:
        value = equality()
        while peek() == "&&":
            take()
            value = equality() and value
        return value

    def equality() -> bool:
        value = unary()
        while peek() in ("==", "!="):
            op = take()
            other = unary()
            value = (value == other) if op == "==" else (value != other)
        return value

    def unary() -> bool:
        token = take()
        if token == "!":
            return not unary()
        if token == "(":
            value = disjunction()
            if take() != ")":
                raise ValueError(f"unbalanced #if condition {text!r}")
            return value
        if token == "true":
            return True
        if token == "false":
            return False
        return token in symbols

    value = disjunction()
    if at != len(tokens):
        raise ValueError(f"cannot read #if condition {text!r}")
    return value


_LEXEMES = re.compile(
    r'@"(?:[^"]|"")*"|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)\'|//[^\n]*|/\*.*?\*/', re.S
)


def _without_comments(source: str) -> str:
    def keep(m: re.Match[str]) -> str:
        s = m.group(0)
        if s.startswith("//"):
            return ""
        if s.startswith("/*"):
            return "\n" * s.count("\n")
        return s

    return _LEXEMES.sub(keep, source)


def active_lines(source: str, symbols: set[str]) -> list[tuple[int, str]]:
    """The (line number, text) pairs a compiler with these defines sees."""
    symbols = set(symbols)
    out: list[tuple[int, str]] = []
    # each frame: (this branch active, some branch of this #if taken, the enclosing one active)
    stack: list[list[bool]] = []
    active = True
    for number, line in enumerate(_without_comments(source).split("\n"), 1):
        directive = re.match(r"\s*#\s*(\w+)\s*(.*)$", line)
        if not directive:
            if active:
                out.append((number, line))
            continue
        word, rest = directive.group(1), directive.group(2).strip()
        if word == "if":
            value = active and _condition(rest, symbols)
            stack.append([value, value, active])
            active = value
        elif word == "elif":
            frame = stack[-1]
            value = frame[2] and not frame[1] and _condition(rest, symbols)
            frame[0], frame[1] = value, frame[1] or value
            active = value
        elif word == "else":
            frame = stack[-1]
            value = frame[2] and not frame[1]
            frame[0], frame[1] = value, True
            active = value
        elif word == "endif":
            active = stack.pop()[2]
        elif word == "define" and active:
            symbols.add(rest.split()[0])
        elif word == "undef" and active:
            symbols.discard(rest.split()[0])
    if stack:
        raise ValueError("an #if without its #endif")
    return out


_DLLIMPORT = re.compile(
    r"\bDllImport(?:Attribute)?\s*\(\s*(@?\"(?:[^\"\\]|\\.)*\"|[A-Za-z_][\w.]*)"
)
_CONST = re.compile(r"\bconst\s+string\s+([A-Za-z_]\w*)\s*=\s*\"((?:[^\"\\]|\\.)*)\"")


def pinvoke_libraries(source: str, symbols: set[str]) -> list[tuple[int, str]]:
    """(line, library) of every DllImport compiled under these defines (library None: not
    resolved)."""
    lines = active_lines(source, symbols)
    consts = {m.group(1): m.group(2) for _, text in lines for m in _CONST.finditer(text)}
    found = []
    for number, text in lines:
        for m in _DLLIMPORT.finditer(text):
            arg = m.group(1)
            if arg.startswith(('"', '@"')):
                found.append((number, arg.lstrip("@")[1:-1]))
            else:
                found.append((number, consts.get(arg.split(".")[-1])))
    return found


# ---- the checks --------------------------------------------------------------------------


class Checks:
    def __init__(self) -> None:
        self.passed = self.failed = 0

    def report(self, ok: bool, what: str, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"ok: {what}")
        else:
            self.failed += 1
            print(f"FAILED: {what}" + (f"\n  {detail}" if detail else ""))
        return ok


def check_sources(checks: Checks) -> None:
    offenders, unresolved, seen = [], [], 0
    for path in sorted(PKG.rglob("*.cs")):
        source = path.read_text(encoding="utf-8")
        if "DllImport" not in source:
            continue
        for where, symbols in WHERE_INTERNAL_MUST_NOT_BE.items():
            try:
                imports = pinvoke_libraries(source, symbols)
            except ValueError as e:
                unresolved.append(f"{path}: {e}")
                break
            seen += len(imports)
            for line, library in imports:
                if library is None:
                    unresolved.append(
                        f"{path}:{line}: the library name is not a string constant of the file"
                    )
                elif library == "__Internal":
                    offenders.append(f"{path}:{line} ({where})")
    checks.report(
        seen > 0 and not unresolved,
        "every P/Invoke's library is readable from the source",
        "; ".join(unresolved[:5]) or "no P/Invoke found at all",
    )
    checks.report(
        not offenders,
        'every "__Internal" P/Invoke is behind a mobile-platform #if '
        "(none in a desktop player, an Editor or the test build)",
        "compiled in: "
        + "; ".join(sorted(set(offenders))[:8])
        + (" …" if len(offenders) > 8 else ""),
    )


def compile_variant(
    checks: Checks, build: Path, name: str, defines: set[str], editor: bool = False
) -> Path | None:
    sources = [str(STUB), *sorted(str(p) for p in (PKG / "Runtime").rglob("*.cs"))]
    out = build / f"Igi.Sdk.Runtime.{name}.dll"
    flags = [f"-define:{';'.join(sorted(defines))}"] if defines else []
    done = subprocess.run(
        [*MCS, *flags, "-target:library", f"-out:{out}", *sources],
        capture_output=True,
        text=True,
        timeout=300,
    )
    ok = checks.report(
        done.returncode == 0,
        f"the Runtime compiles as the {name} build ({' '.join(sorted(defines))})",
        (done.stdout + done.stderr).strip()[-1500:],
    )
    if not ok:
        return None
    if editor:
        extra = [
            (
                "the Editor code",
                [str(EDITOR_STUB), *sorted(str(p) for p in (PKG / "Editor").rglob("*.cs"))],
            ),
            ("the NPC Dialogue sample", sorted(str(p) for p in (PKG / "Samples~").rglob("*.cs"))),
        ]
        for what, files in extra:
            target = build / f"{what.split()[-1]}.{name}.dll"
            done = subprocess.run(
                [*MCS, *flags, "-target:library", f"-r:{out}", f"-out:{target}", *files],
                capture_output=True,
                text=True,
                timeout=300,
            )
            checks.report(
                done.returncode == 0,
                f"{what} compiles for the {name}",
                (done.stdout + done.stderr).strip()[-1500:],
            )
    return out


def pinvokes_in(assembly: Path) -> list[tuple[str, str]]:
    """(class, library) of every P/Invoke in the compiled assembly, read by ikdasm."""
    text = subprocess.run(
        ["ikdasm", str(assembly)], capture_output=True, text=True, timeout=120
    ).stdout
    found, classes, depth = [], [], 0
    pending = None
    for line in text.split("\n"):
        s = line.strip()
        if s.startswith(".class "):
            pending = s.split()[-1]
        if "{" in s and pending is not None:
            classes.append((pending, depth))
            pending = None
        depth += s.count("{") - s.count("}")
        while classes and depth <= classes[-1][1]:
            classes.pop()
        m = re.search(r'pinvokeimpl\("([^"]*)"', s)
        if m:
            found.append((classes[-1][0] if classes else "?", m.group(1)))
    return found


def check_assemblies(checks: Checks, built: dict[str, Path]) -> None:
    expected = {
        "Windows player": {"kernel32"},
        "macOS player": {"/usr/lib/libSystem.dylib"},
        "Linux player": {"libc"},
        "iOS player": {"__Internal"},
        "WebGL player": set(),
    }
    for name, libraries in expected.items():
        if name not in built:
            continue
        pinvokes = pinvokes_in(built[name])
        watch = {lib for cls, lib in pinvokes if cls.endswith("ProcessWatch")}
        checks.report(
            watch == libraries,
            f"the {name}'s process checks call {sorted(libraries) or 'nothing'}",
            f"ProcessWatch's P/Invokes name {sorted(watch)}",
        )
        if name != "iOS player":
            internal = sorted({cls for cls, lib in pinvokes if lib == "__Internal"})
            checks.report(
                not internal and bool(pinvokes),
                f'no P/Invoke of the {name} names "__Internal"',
                f"in {internal}"
                if internal
                else "no P/Invoke read back at all (ikdasm output changed?)",
            )


def main() -> int:
    build = Path(sys.argv[1])
    build.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    check_sources(checks)
    built = {}
    for name, defines in (
        ("Windows player", PLAYERS["Windows player (IL2CPP)"]),
        ("macOS player", PLAYERS["macOS player (IL2CPP)"]),
        ("Linux player", PLAYERS["Linux player (IL2CPP)"]),
        ("iOS player", {"UNITY_IOS", "ENABLE_IL2CPP"}),
        ("WebGL player", {"UNITY_WEBGL", "ENABLE_IL2CPP"}),
        ("Windows Editor", EDITORS["Windows Editor, own target"]),
    ):
        out = compile_variant(checks, build, name, defines, editor=name.endswith("Editor"))
        if out is not None:
            built[name] = out
    if shutil.which("ikdasm"):
        check_assemblies(checks, built)
    else:
        checks.report(
            False, "the compiled P/Invokes are read back", "ikdasm not found (mono-devel)"
        )
    print(f"platform checks: {checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
