"""Mutation testing of the modules whose mistakes give a GPU twice or place a pod wrongly (issue 31).

Each module of MODULES is mutated by mutmut (pinned in pyproject's `mutate` extra) in a scratch copy of the
commit, never in this work tree, which others' test runs share. mutmut first runs the module's test folders once
to learn which tests call which function; each mutant then runs only the tests that call its function, stopping
at the first failure. A module gets a time bound: when it is hit, the mutants not yet checked are counted as such
and the score is over those checked.

    python loadtests/mutation_score.py [--module bind ...] [--jobs 2] [--write BENCHMARKS.md]
    python loadtests/mutation_score.py --worktree --module ledger --keep /tmp/mutate   # uncommitted tests too

Score: (killed + timeout) / mutants checked; a timeout is a mutant the tests noticed (mutmut's CPU limit, here
10 times the covering tests' own CPU time plus 10 s). "No tests": no test of the module's folders calls the mutated
function, counted as not killed. Exit 1 when a module's score is below its floor, or mutmut fails (its clean run, say).
With `--keep DIR` the scratch copy stays: `cd DIR && mutmut results` / `mutmut show NAME` list the survivors.
"""

from __future__ import annotations

import argparse
import json
import re
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "loadtests"))

from bench_select import measured_commit, run_header, write_section  # noqa: E402

BEGIN, END = "<!-- mutation_score:begin -->", "<!-- mutation_score:end -->"
TOOL = "mutmut"


@dataclass(frozen=True)
class Module:
    """A module as mutated: its files, the test folders that exercise it, its time bound and its score floor."""

    name: str
    files: tuple[str, ...]
    tests: tuple[str, ...]
    bound_s: int
    floor: float
    """The lowest score (0..1) a run may give; set from the first measurement (BENCHMARKS.md says how)."""


VERBS, GROUPS, CACHE = "tests/extender/verbs", "tests/extender/groups", "tests/extender/cache"
KUBE, SERVER = "tests/extender/kube", "tests/extender/server"
# Floors: each module's first measurement after its surviving mutants that mattered were killed (BENCHMARKS.md,
# 2026-11-28), rounded down to the whole percent, less 3 points: a run that hits its time bound checks the fastest
# mutants first, so its score moves a little with the machine's load, and so do timeouts.
MODULES = (
    # The budget's fallback (_without_search, _greedy) is reached only by the hostile boards' tests.
    Module("selection", ("topology/select.py",), ("tests/topology", f"{VERBS}/test_hostile_topology.py"), 900, 0.83),
    Module("ledger", ("extender/cache/ledger.py", "extender/cache/assignments.py"),
           (CACHE, VERBS, GROUPS, KUBE, SERVER), 900, 0.85),
    Module("bind", ("extender/verbs/bind.py",), (CACHE, VERBS, GROUPS, KUBE, SERVER), 900, 0.82),
    Module("filter", ("extender/verbs/filter.py",), (CACHE, VERBS, GROUPS, SERVER), 600, 0.91),
    Module("preempt", ("extender/verbs/preempt.py",), (CACHE, VERBS), 300, 0.92),
    Module("drains", ("extender/verbs/drains.py",), (CACHE, VERBS, GROUPS), 600, 0.76),
    Module("group planner",
           ("extender/verbs/group_placement.py", "extender/groups/layouts.py", "extender/groups/plans.py"),
           (CACHE, GROUPS, VERBS, KUBE), 900, 0.73),
)

LEDGER, BOOK, SELECT = "extender/cache/ledger.py", "extender/cache/assignments.py", "topology/select.py"
FILTER = "extender/verbs/filter.py"
_DEFAULTS = "FilterOutcome's fields default to empty: the argument left out is what it was"
_DIAGONAL = "adds mbps[i][i], which compile_topology sets to 0"
_ALWAYS = "every entry of `_by_pod` is also in `_by_node` (put and remove keep both), so the default is never used"
EQUIVALENT: dict[tuple[str, str], str] = {
    (BOOK, "def remove(self, pod_uid: str, at: float, *, freed: bool = False) -> Assignment | None:"):
        "the default is never used: the ledger's `release`, the one caller, always passes `freed`",
    (LEDGER, "self.record(replace(assignment, phase=Phase.BOUND, ))"):
        "an expiry is read only from the UNCERTAIN index, which `put` leaves for any other phase",
    (BOOK, "self.put(replace(entry, gpus=allocated, at=view.observed, phase=Phase.ALLOCATED, ))"):
        "an expiry is read only from the UNCERTAIN index, which `put` leaves for any other phase",
    (BOOK, "for gpu in [gpu for gpu, at in released.items() if at < observed]:"):
        "forgetting the releases a report has seen only saves memory: `released_since` never counts them",
    (BOOK, "node_entries = self._by_node.get(entry.node, None)"): _ALWAYS,
    (FILTER, "return FilterOutcome([], {pod.problem: list(names)}, )"): _DEFAULTS,
    (FILTER, "return FilterOutcome(list(names), {})"): _DEFAULTS,
    (FILTER, "return FilterOutcome(list(names), {}, )"): _DEFAULTS,
    (FILTER, "outcome = FilterOutcome(groups[0], {})"): _DEFAULTS,
    (FILTER, "outcome = FilterOutcome(groups[0], {}, )"): _DEFAULTS,
    (FILTER, "unhealthy: int, waiting: bool = True) -> Verdict:"):
        "the default is never used: filter's `_verdict`, node_verdict's one caller, always passes `waiting`",
    (BOOK, "node_entries = self._by_node.get(entry.node, )"): _ALWAYS,
    (BOOK, "node_entries.pop(entry.pod_uid, )"): _ALWAYS,
    (SELECT, 'assert isinstance(unconstrained, Choice), '
             '"XXk free GPUs always form some ring (pair bandwidths are > 0)XX"'): "an assertion's message",
    (SELECT, "raise AssertionError(None)"): "an assertion's message",
    **{(SELECT, f"first = max(members, key=lambda i: (max((mbps[i][j] for j in members if j != i), {default}), -i))"):
       "the default serves a lone free GPU only, and the fallback runs with k >= 2 of them"
       for default in ("default=None", "default=1", "")},
    **{(SELECT, f"best_key = [{sentinel}]  # (total, -NUMA span, -cut): larger is better"):
       "the sentinel below every set's key: any total is >= 0"
       for sentinel in ("(-2, 0, 0)", "(-1, 1, 0)", "(-1, 0, 1)")},
    (SELECT, "return _ring_mbps(compiled, chosen, budget), sum(mbps[i][j] for i in chosen for j in chosen if i <= j)"):
        _DIAGONAL,
    (SELECT, "pair_max = max(mbps[i][j] for i in members for j in members if i <= j)"): _DIAGONAL,
    (SELECT, "values = sorted({compiled.mbps[i][j] for i in members for j in members if i <= j}, reverse=True)"):
        "adds a threshold of 0 after the slowest pair's, which always closes a ring first",
    (SELECT, "+ need * (need - 1) / 2 * pair_max"): "need x (need - 1) is even: the float equals the integer",
    **{(SELECT, f"components = [c for c in _components(_prune(free, adjacency, 2 if {test} else 1), adjacency)"):
       "pruning GPUs with one usable neighbour less often: the search tests every ring anyway, so the answer is the "
       "same, at more steps" for test in ("(k >= 3) and False", "k > 3", "k >= 4")},
}
"""Survivors judged equivalent, by (file, the mutated line as mutmut shows it after `+`): why no test can see them."""

DETECTED = ("killed", "timeout", "segfault")
"""mutmut's statuses of a mutant the tests noticed (`segfault` is also its name for a worker killed at its limit)."""


@dataclass
class Result:
    module: Module
    statuses: Counter[str] = field(default_factory=Counter)
    survivors: list[tuple[str, str]] = field(default_factory=list)
    """(mutant name, its diff) of each survivor and each mutant no test calls."""
    seconds: float = 0.0
    bounded: bool = False
    error: str = ""

    @property
    def checked(self) -> int:
        return sum(n for status, n in self.statuses.items() if status not in ("not checked", "skipped"))

    @property
    def detected(self) -> int:
        return sum(self.statuses[status] for status in DETECTED)

    @property
    def score(self) -> float:
        return self.detected / self.checked if self.checked else 0.0

    def equivalent(self) -> list[tuple[str, str, str]]:
        """(mutant name, mutated line, why) of the survivors EQUIVALENT names."""
        found = []
        for name, diff in self.survivors:
            for path in self.module.files:
                for line in _added_lines(diff):
                    why = EQUIVALENT.get((path, line))
                    if why:
                        found.append((name, line, why))
        return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", choices=[m.name for m in MODULES],
                        help="only this module (repeatable); default every one")
    parser.add_argument("--jobs", type=int, default=4,
                        help="mutmut's workers (default 4: the extender's tests mostly wait on sockets and clocks)")
    parser.add_argument("--bound-scale", type=float, default=1.0, help="multiply every module's time bound")
    parser.add_argument("--worktree", action="store_true",
                        help="mutate this work tree's files (tracked and untracked) instead of HEAD's")
    parser.add_argument("--keep", metavar="DIR", help="keep the scratch copy in DIR (emptied first)")
    parser.add_argument("--write", metavar="PATH", help="rewrite the mutation_score section of this Markdown file")
    args = parser.parse_args(argv)
    modules = [m for m in MODULES if not args.module or m.name in args.module]

    started = time.monotonic()
    if args.keep:
        scratch = Path(args.keep).resolve()
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="mutate-"))
    try:
        commit = _populate(scratch, args.worktree)
        results = []
        for module in modules:
            results.append(_run_module(scratch, module, args.jobs, args.bound_scale))
            for name, diff in results[-1].survivors:
                print(f"\n# {module.name}: {name}\n{diff}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - started

    print(_table(results, commit.split()[0]))
    misses = [f"{r.module.name}: {r.error}" for r in results if r.error]
    misses += [f"{r.module.name}: score {r.score:.1%} below its floor {r.module.floor:.0%}"
               for r in results if not r.error and r.score < r.module.floor]
    if args.write:
        path = Path(args.write)
        write_section(path, _section(argv, elapsed, commit, args, results, _previous(path)), BEGIN, END)
    for miss in misses:
        print(f"mutation_score.py: missed: {miss}", file=sys.stderr)
    return 1 if misses else 0


def _populate(scratch: Path, worktree: bool) -> str:
    """Copy the code and tests into `scratch` and build the C extension there; the commit line to report."""
    if worktree:
        files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                               capture_output=True, check=True).stdout.decode().split("\0")
        for name in filter(None, files):
            source = ROOT / name
            if source.is_file():
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, scratch / name)
        commit = measured_commit()
    else:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
        commit = f"`{head}` (its tree, copied by `git archive`)"
    # pyproject's ext-modules, as `pip install -e` builds them, into the copy's extender/api/.
    subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "build_ext", "--inplace", "-q"],
                   cwd=scratch, check=True, capture_output=True)
    return commit


def _config(scratch: Path, module: Module) -> str:
    """mutmut's setup.cfg for one module (pyproject.toml has no [tool.mutmut], so mutmut reads setup.cfg)."""
    sources = ("topology", "extender")
    also = sorted(p.name for p in scratch.iterdir()
                  if p.name not in (*sources, "tests", "mutants", "setup.cfg", "pyproject.toml", "build"))

    def lines(values: Sequence[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    # A mutant's CPU limit is 2 x multiplier x (its tests' own time + 1 s): mutmut's 15 lets a mutant that
    # loops (a budget that never runs out) hold a worker for minutes; 5 still leaves 10 times the tests' CPU time.
    return (f"[mutmut]\nsource_paths ={lines(sources)}\nonly_mutate ={lines(module.files)}\n"
            f"also_copy ={lines(also)}\npytest_add_cli_args_test_selection ={lines(module.tests)}\n"
            "timeout_multiplier = 5\n")


def _run_module(scratch: Path, module: Module, jobs: int, bound_scale: float) -> Result:
    """One mutmut run over one module in `scratch`, stopped at the module's time bound."""
    result = Result(module)
    shutil.rmtree(scratch / "mutants", ignore_errors=True)
    (scratch / "setup.cfg").write_text(_config(scratch, module), encoding="utf-8")
    names = [_dotted(path) + ".*" for path in module.files]
    mutmut = Path(sys.executable).with_name("mutmut")
    command = [str(mutmut), "run", "--max-children", str(jobs), *names]
    bound = module.bound_s * bound_scale
    print(f"mutation_score.py: {module.name}: {' '.join(command[1:])} (bound {bound:.0f} s)", flush=True)
    log = scratch / f"mutmut-{module.name.replace(' ', '-')}.log"
    started = time.monotonic()
    exit_codes: dict[str, dict[str, int | None]] = {}
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=scratch, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=lambda: os.nice(10))
        code = None
        while code is None and time.monotonic() - started < bound:
            try:
                code = process.wait(timeout=min(15.0, max(0.1, bound - (time.monotonic() - started))))
            except subprocess.TimeoutExpired:
                _read_exit_codes(scratch, module, exit_codes)  # mutmut rewrites them whole: keep the last read
        if code is None:
            result.bounded = True
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            code = 0
    result.seconds = time.monotonic() - started
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:].replace("\r", "\n").splitlines()
        result.error = f"mutmut exited {code}: " + " | ".join(line for line in tail[-5:] if line.strip())
    _read_exit_codes(scratch, module, exit_codes)
    _collect(scratch, result, exit_codes)
    print(_table([result], "this run"), flush=True)
    if not result.error and not result.checked:
        result.error = "no mutant was checked"
    return result


def _read_exit_codes(scratch: Path, module: Module, exit_codes: dict[str, dict[str, int | None]]) -> None:
    """Each file's mutant exit codes from mutmut's meta file, where it reads whole: one stopped mid-write (at the
    time bound) keeps the last read."""
    for path in module.files:
        try:
            meta = json.loads((scratch / "mutants" / (path + ".meta")).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        exit_codes[path] = meta["exit_code_by_key"]


def _collect(scratch: Path, result: Result, exit_codes: dict[str, dict[str, int | None]]) -> None:
    """The statuses of the module's mutants, and the survivors' diffs."""
    from mutmut.stats import status_by_exit_code

    undetected = []
    for path in result.module.files:
        for name, code in exit_codes.get(path, {}).items():
            status = status_by_exit_code[code]
            result.statuses[status] += 1
            if status in ("survived", "no tests"):
                undetected.append((name, path))
    if undetected:
        result.survivors = _diffs(scratch, undetected)


def _diffs(scratch: Path, mutants: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """mutmut's diff of each mutant, as `mutmut show` prints it, read in one child process."""
    code = ("import json, sys\nfrom mutmut.mutation.diff_apply import get_diff_for_mutant\n"
            "print(json.dumps([get_diff_for_mutant(n, path=p) for n, p in json.load(sys.stdin)]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=scratch, input=json.dumps(mutants), text=True,
                         capture_output=True, check=True).stdout
    return [(name, diff) for (name, _), diff in zip(mutants, json.loads(out))]


def _added_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def _removed_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]


def _dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _table_head() -> list[str]:
    return ["| module | files | test folders | mutants | killed | timeout | survived | no tests | not checked "
            "| score | floor | run time | commit |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]


def _row(r: Result, commit: str) -> str:
    s = r.statuses
    killed = s["killed"] + s["segfault"]
    bounded = " (bound hit)" if r.bounded else ""
    score = "error" if r.error else f"{r.score:.1%}" + (" **below**" if r.score < r.module.floor else "")
    return (f"| {r.module.name} | {', '.join(f'`{f}`' for f in r.module.files)} "
            f"| {', '.join(t.removeprefix('tests/') for t in r.module.tests)} | {sum(s.values())} | {killed} "
            f"| {s['timeout']} | {s['survived']} | {s['no tests']} | {s['not checked']} | {score} "
            f"| {r.module.floor:.0%} | {_minutes(r.seconds)}{bounded} | {commit} |")


def _table(results: Sequence[Result], commit: str = "") -> str:
    return "\n".join(_table_head() + [_row(r, commit) for r in results])


def _survivor_line(name: str, diff: str) -> str:
    function = name.rsplit(".", 1)[-1].split("__mutmut_")[0].removeprefix("x_").replace("ǁ", ".").strip(".")
    removed, added = _removed_lines(diff), _added_lines(diff)
    return f"`{function}`: `{' / '.join(removed)}` → `{' / '.join(added)}`"


def _section(argv: Sequence[str] | None, elapsed: float, commit: str, args: argparse.Namespace,
             results: Sequence[Result], previous: str) -> str:
    """The section: this run's modules, and the rows and lists of the modules it did not run from `previous`
    (the section as it stood), each row naming the commit it measured."""
    import importlib.metadata

    version = importlib.metadata.version(TOOL)
    short = commit.split()[0]
    ran = {r.module.name for r in results}
    kept = [m.name for m in MODULES if m.name not in ran and _old_row(previous, m.name)]
    quoted = [shlex.quote(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    head = run_header("Mutation testing", "mutation_score.py", quoted, elapsed)
    head = [f"- Commit: {commit}" + (f"; the rows of {', '.join(kept)} are kept from an earlier run, at the commit "
                                     "their row names." if kept else ".") if line.startswith("- Commit:") else line
            for line in head]
    head += _earlier_runs(previous, kept)
    lines = head + [
        f"- Tool: mutmut {version}, {args.jobs} workers at nice 10, in a scratch copy. Each mutant runs only the "
        "tests of its module's folders that call the mutated function (mutmut's stats run), `-x`; `make mutate` "
        "runs this script.",
        "- Score = (killed + timeout) / mutants checked. Timeout: past mutmut's CPU limit, 10 times the covering "
        "tests' own CPU time plus 10 s; killed counts a worker killed at that limit (mutmut's `segfault`); no "
        "tests: no test of those folders calls the function. Floor: the lowest score a run may give (exit 1 below "
        "it), the module's first measurement after its survivors that mattered were killed, rounded down to the whole "
        "percent, less 3 points (a run cut by its time bound checks the fastest mutants first, and timeouts move with "
        "the load); run time includes mutmut's stats run over the test folders.",
        ""] + _table_head()
    by_name = {r.module.name: r for r in results}
    for module in MODULES:
        if module.name in by_name:
            lines.append(_row(by_name[module.name], short))
        elif module.name in kept:
            lines.append(_kept_row(_old_row(previous, module.name), module))
    for r in results:
        if r.error:
            lines += ["", f"**{r.module.name}: {r.error}**"]
    lines += ["", "### Survivors judged equivalent", ""]
    equivalent = [f"- {r.module.name}: `{line}` (`{name}`): {why}" for r in results for name, line, why in
                  r.equivalent()]
    equivalent += [line for line in _old_block(previous, "### Survivors judged equivalent").splitlines()
                   if line.startswith("- ") and line[2:].split(":", 1)[0] in kept]
    lines += equivalent or ["None listed."]
    for module in MODULES:
        if module.name in by_name and by_name[module.name].survivors:
            r = by_name[module.name]
            lines += ["", f"<details><summary>{r.module.name}: {len(r.survivors)} survivors (survived or no tests)"
                      "</summary>", ""]
            lines += [f"- {_survivor_line(name, diff)}" for name, diff in r.survivors]
            lines += ["", "</details>"]
        elif module.name in kept:
            block = _old_block(previous, f"<details><summary>{module.name}: ")
            if block:
                lines += ["", block]
    return "\n".join(lines)


def _kept_row(row: str, module: Module) -> str:
    """A row of an earlier run, judged by the module's floor as it stands now."""
    cells = row.split(" | ")
    score = cells[9].removesuffix(" **below**")
    if score.endswith("%"):
        below = float(score.removesuffix("%")) / 100 < module.floor
        cells[9] = score + (" **below**" if below else "")
    cells[10] = f"{module.floor:.0%}"
    return " | ".join(cells)


def _earlier_runs(previous: str, kept: Sequence[str]) -> list[str]:
    """For the rows kept from `previous`, the runs that measured them: its own run's command, and the earlier runs
    it named for rows it had kept in turn."""
    lines = previous.splitlines()
    command = next((line.removeprefix("- Command: ") for line in lines if line.startswith("- Command: ")), "")
    commit = re.search(r"`([0-9a-f]+)", next((line for line in lines if line.startswith("- Commit: ")), ""))
    own = [name for name in kept if commit and _old_row(previous, name).endswith(f"| `{commit[1]}` |")]
    runs = [f"- Earlier run, rows of {', '.join(own)}: {command} at `{commit[1]}`"] if own and command else []
    for line in lines:
        if line.startswith("- Earlier run, rows of "):
            names, run = line.removeprefix("- Earlier run, rows of ").split(": ", 1)
            still = [name for name in names.split(", ") if name in kept and name not in own]
            if still:
                runs.append(f"- Earlier run, rows of {', '.join(still)}: {run}")
    return runs


def _previous(path: Path) -> str:
    """The section as it stands in `path`, or ''."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return text.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in text and END in text else ""


def _old_row(previous: str, name: str) -> str:
    return next((line for line in previous.splitlines() if line.startswith(f"| {name} |")), "")


def _old_block(previous: str, start: str) -> str:
    """From the line starting with `start` to `</details>` or the next blank line after a list, in `previous`."""
    if start not in previous:
        return ""
    block = start + previous.split(start, 1)[1]
    if start.startswith("<details>"):
        return block.split("</details>", 1)[0] + "</details>"
    return block.split("\n\n", 2)[1] if block.count("\n\n") >= 1 else ""


if __name__ == "__main__":
    raise SystemExit(main())
