"""Run llama.cpp's own server test suite against ``igi-sdk serve --http``.

Their tests (``tools/server/tests`` of llama.cpp) ship inside the llama-cpp-python sdist that this
project pins: the sdist is fetched from PyPI by pip, checked against its SHA-256, and only that
folder is unpacked, into a cache folder (nothing of llama.cpp is committed here). Their
``ServerProcess`` starts ``$LLAMA_SERVER_BIN_PATH`` with llama-server's command line: that is
``llama_server.py`` here, which starts the sidecar instead.

Each test's expected outcome is in ``expected.txt`` (see ``expectations.py``). The run fails when
a test expected to pass does not, when a known incompatibility passes (the list is then stale),
or when a test of the chosen files is missing from the list.

    PYTHONPATH=$PWD .venv/bin/python -m tests.llamacpp_server            # the chosen files
    PYTHONPATH=$PWD .venv/bin/python -m tests.llamacpp_server --run-all  # skipped ones too
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.llamacpp_server.expectations import Expected, load, match

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXPECTED = HERE / "expected.txt"

# the llama-cpp-python the project pins (pyproject.toml), its sdist's digest on PyPI
PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TESTS_IN_SDIST = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/tools/server/tests/"

# their test files this suite runs (the OpenAI-facing ones and the native routes mods call)
FILES = (
    "unit/test_basic.py",
    "unit/test_chat_completion.py",
    "unit/test_completion.py",
    "unit/test_tokenize.py",
    "unit/test_embedding.py",
    "unit/test_security.py",
    "unit/test_ctx_shift.py",
    "unit/test_tool_call.py",
)


class FetchError(RuntimeError):
    pass


def cache_dir() -> Path:
    env = os.environ.get("IGI_LLAMACPP_TESTS_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "igi-sdk" / "llamacpp-server-tests"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(dest: Path) -> Path:
    """The sdist, by pip (PyPI or the index pip is configured with), checked by digest."""
    sdist = dest / SDIST
    if sdist.is_file() and _sha256(sdist) == SDIST_SHA256:
        return sdist
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", f"{PACKAGE}=={VERSION}",
           "--no-binary", ":all:", "--no-deps", "-d", str(dest)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0 or not sdist.is_file():
        raise FetchError(f"pip download {PACKAGE}=={VERSION} failed:\n{r.stdout}{r.stderr}")
    got = _sha256(sdist)
    if got != SDIST_SHA256:
        sdist.unlink()
        raise FetchError(f"{SDIST}: SHA-256 {got}, expected {SDIST_SHA256}")
    return sdist


def _extract(sdist: Path, out: Path) -> None:
    """Only their tests folder; a member that would land outside it is refused."""
    tmp = Path(tempfile.mkdtemp(prefix="tests-", dir=out.parent))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for m in tar.getmembers():
                if not m.name.startswith(TESTS_IN_SDIST) or not (m.isfile() or m.isdir()):
                    continue
                rel = m.name[len(TESTS_IN_SDIST):]
                if not rel:
                    continue
                target = (tmp / rel).resolve()
                if tmp.resolve() not in target.parents:
                    raise FetchError(f"{SDIST}: member {m.name} leaves its folder")
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                if src is None:
                    continue
                with src, target.open("wb") as f:
                    shutil.copyfileobj(src, f)
        if not (tmp / "utils.py").is_file():
            raise FetchError(f"{SDIST} holds no {TESTS_IN_SDIST}utils.py")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def fetch_tests() -> Path:
    """Their ``tools/server/tests`` folder, unpacked once per sdist digest."""
    base = cache_dir()
    out = base / f"tests-{SDIST_SHA256[:16]}"
    if (out / "utils.py").is_file():
        return out
    sdist = Path(os.environ["IGI_LLAMACPP_SDIST"]) if os.environ.get("IGI_LLAMACPP_SDIST") \
        else _download(base)
    if _sha256(sdist) != SDIST_SHA256:
        raise FetchError(f"{sdist}: not the pinned {SDIST}")
    base.mkdir(parents=True, exist_ok=True)
    _extract(sdist, out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Report:
    outcomes: dict[str, str]  # node id -> passed | failed | skipped
    messages: dict[str, str]  # node id -> the failure's first line, or the skip's reason
    where: dict[str, list[str]]  # node id -> the source lines a failure's traceback marks
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # their pytest and every sidecar it started

    def count(self, outcome: str) -> int:
        return sum(1 for v in self.outcomes.values() if v == outcome)

    def summary(self, expected: dict[str, Expected]) -> str:
        by = {"pass": 0, "partial": 0, "incompatible": 0, "skip": 0}
        for nodeid in self.outcomes:
            exp = expected.get(nodeid) or match(expected, nodeid)
            if exp is not None:
                by[exp.outcome] += 1
        return (f"{len(self.outcomes)} tests: {self.count('passed')} passed, "
                f"{self.count('failed')} failed, {self.count('skipped')} skipped; expected "
                f"{by['pass']} pass, {by['partial']} partial, {by['incompatible']} "
                f"incompatible, {by['skip']} skip; {len(self.problems)} problems; "
                f"{self.seconds:.0f} s ({self.cpu_seconds:.0f} CPU-s)")


def read_results(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, list[str]]]:
    """Each test's outcome, its failure's first line (or skip reason), and the source lines its
    traceback marks (``>`` lines: the call in each frame, the failing check last), from the
    plugin's JSON lines; a teardown failure fails a test that passed its call."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    where: dict[str, list[str]] = {}
    if not path.is_file():
        return outcomes, messages, where
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        nodeid = r["nodeid"]
        if outcomes.get(nodeid) == "failed":
            continue
        outcomes[nodeid] = r["outcome"]
        messages[nodeid] = r["message"].splitlines()[0][:300] if r["message"] else ""
        where[nodeid] = r["where"]
    return outcomes, messages, where


def compare(outcomes: dict[str, str], where: dict[str, list[str]],
            expected: dict[str, Expected]) -> list[str]:
    problems = []
    for nodeid, got in sorted(outcomes.items()):
        exp = match(expected, nodeid)
        if exp is None:
            problems.append(f"not in expected.txt ({got}): {nodeid}")
        elif exp.outcome == "pass" and got != "passed":
            problems.append(f"expected to pass, {got}: {nodeid}")
        elif exp.outcome == "incompatible" and got == "passed":
            problems.append(f"a known incompatibility now passes (move it to [pass]): {nodeid}")
        elif exp.outcome == "partial":
            if got == "passed":
                problems.append(f"expected to fail at `{exp.at}`, passed (move it to [pass]): "
                                f"{nodeid}")
            elif got == "failed" and not any(exp.at in ln for ln in where.get(nodeid, [])):
                at = (where.get(nodeid) or ["?"])[-1]
                problems.append(f"expected to fail at `{exp.at}`, failed earlier at `{at}`: "
                                f"{nodeid}")
    for key, exp in expected.items():
        if not key.endswith("*") and exp.outcome != "skip" and key not in outcomes:
            problems.append(f"listed in expected.txt but not run: {key}")
    return problems


def run(*, files: tuple[str, ...] = FILES, run_all: bool = False, select: list[str] | None = None,
        junit: Path | None = None, results: Path | None = None, timeout_s: float = 1800.0,
        verbose: bool = False) -> Report:
    """Run their tests in one pytest process against the sidecar; compare with expected.txt."""
    tests = fetch_tests()
    expected = load(EXPECTED)
    work = Path(tempfile.mkdtemp(prefix="llamacpp-suite-"))
    try:
        launcher = work / "llama-server"
        # their ServerProcess runs this path with no interpreter: a script that starts ours
        standin = HERE / "llama_server.py"
        launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{standin}" "$@"\n')
        launcher.chmod(0o755)
        results = results or work / "results.jsonl"
        results.unlink(missing_ok=True)
        env = {
            **os.environ,
            "LLAMA_SERVER_BIN_PATH": str(launcher),
            "PORT": str(_free_port()),
            "LLAMA_CACHE": str(work / "cache"),
            "IGI_STANDIN_DIR": str(work),
            "IGI_LLAMACPP_EXPECTED": "" if run_all else str(EXPECTED),
            "IGI_LLAMACPP_RESULTS": str(results),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.pop("DEBUG", None)  # their DEBUG adds --verbose and prints every response
        env.pop("DEBUG_EXTERNAL", None)
        cmd = [sys.executable, "-m", "pytest", "-p", "igi_llamacpp_plugin",
               "-p", "no:cacheprovider", "-q", "-rN", "--tb=long", "--timeout=120",
               *([f"--junitxml={junit}", "-o", "junit_family=xunit2"] if junit else []),
               *(select if select else files)]
        t0 = time.monotonic()
        before = os.times()
        # a session of its own: a run cut short ends with every sidecar it started
        proc = subprocess.Popen(cmd, cwd=tests, env=env, start_new_session=True, text=True,
                                stdout=None if verbose else subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out = (out or "") + f"\n(cut off after {timeout_s:.0f} s)"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # a sidecar left behind
        seconds = time.monotonic() - t0
        after = os.times()
        cpu = (after.children_user - before.children_user
               + after.children_system - before.children_system)
        outcomes, messages, where = read_results(results)
        if not outcomes:
            raise RuntimeError(f"their pytest ran no test (exit {proc.returncode}):\n"
                               f"{(out or '')[-4000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = Report(outcomes, messages, where, seconds=seconds, cpu_seconds=cpu)
    if not run_all and not select:
        report.problems = compare(outcomes, where, expected)
    return report


def markdown(expected: dict[str, Expected], collected: list[str]) -> str:
    """docs/openai.md's tables, from expected.txt (which the CI run holds true)."""
    rows = []
    by_reason: dict[tuple[str, str], list[str]] = {}
    for f in FILES:
        ids = [i for i in collected if i.startswith(f + "::")]
        n = {o: 0 for o in ("pass", "partial", "incompatible", "skip")}
        for i in ids:
            exp = match(expected, i)
            if exp is None:
                continue
            n[exp.outcome] += 1
            by_reason.setdefault((exp.outcome, exp.reason), []).append(i)
        rows.append(f"| `{f[5:]}` | {len(ids)} | {n['pass']} | {n['partial']} | "
                    f"{n['incompatible']} | {n['skip']} |")
    out = ["| file | tests | pass | partial | incompatible | skipped |",
           "| --- | ---: | ---: | ---: | ---: | ---: |", *rows, ""]
    for outcome in ("incompatible", "partial", "skip"):
        out += [f"| {outcome} | tests | why |", "| --- | ---: | --- |"]
        for (o, reason), ids in by_reason.items():
            if o != outcome:
                continue
            names = sorted({i.split("::")[1].split("[")[0] for i in ids})
            shown = ", ".join(f"`{n}`" for n in names[:4]) + (" …" if len(names) > 4 else "")
            out.append(f"| {shown} | {len(ids)} | {reason.replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


def collect(files: tuple[str, ...] = FILES) -> list[str]:
    """Their test ids in ``files`` (collected, not run)."""
    tests = fetch_tests()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
           "IGI_LLAMACPP_EXPECTED": ""}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "igi_llamacpp_plugin",
                        "-p", "no:cacheprovider", "--collect-only", "-q", *files],
                       cwd=tests, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    return [ln for ln in r.stdout.splitlines() if "::" in ln]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.llamacpp_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-all", action="store_true",
                    help="run the tests expected.txt skips as well (nothing is compared)")
    ap.add_argument("--junit", type=Path, help="also write their junit XML here")
    ap.add_argument("-v", "--verbose", action="store_true", help="show their pytest output")
    ap.add_argument("--results", type=Path,
                    help="keep the per-test results (JSON lines) here")
    ap.add_argument("--compare", type=Path, metavar="RESULTS",
                    help="compare saved results with expected.txt (runs nothing)")
    ap.add_argument("--markdown", action="store_true",
                    help="print docs/openai.md's tables from expected.txt (runs nothing)")
    ap.add_argument("tests", nargs="*", help="only these test ids or files (nothing compared)")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(load(EXPECTED), collect()))
        return 0
    expected = load(EXPECTED)
    if args.compare:
        outcomes, messages, where = read_results(args.compare)
        report = Report(outcomes, messages, where, compare(outcomes, where, expected))
    else:
        report = run(run_all=args.run_all, select=args.tests or None, junit=args.junit,
                     results=args.results, verbose=args.verbose)
    for nodeid, got in sorted(report.outcomes.items()):
        exp = match(expected, nodeid)
        want = exp.outcome if exp else "?"
        line = f"{got:8} (expected {want:12}) {nodeid}"
        if got == "failed":
            at = (report.where.get(nodeid) or ["?"])[-1]
            line += f"\n         at `{at}`: {report.messages.get(nodeid, '')}"
        print(line)
    print(report.summary(expected))
    for p in report.problems:
        print("PROBLEM:", p)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
