"""What pytest-sglang costs a pytest run that does not use it: pytest's start with the plugin against `-p no:sglang`.

    python benchmarks/import_cost.py [--runs 20] [--rev REV] [--out results.json]

Every run is a whole `python -m pytest -q -p no:cacheprovider` process in an empty temporary project (one test
file with one plain test, no `--sglang-*` option), timed from spawn to exit (wall) and by its CPU
(RUSAGE_CHILDREN). Bytecode is cached (PYTHONPYCACHEPREFIX, a private folder) as it is for an installed package;
a warm-up run of each variant fills it. Variants, interleaved run by run so machine load falls on all alike:

- `no:sglang`: the plugin installed but disabled, pytest's own start;
- `current`: the plugin of this checkout (on PYTHONPATH, as the tests run it);
- `REV` (with --rev): the plugin of git revision REV (`git archive` into a temporary folder, on PYTHONPATH).

The figure is each variant's median minus the `no:sglang` median (wall and CPU); beside it the median of the run-by-run
differences (each run beside the `no:sglang` run next to it, which cancels slower drift of the load). Then, less
swayed by load, `python -X importtime` runs of the same pytest: the pytest_sglang modules' own import time summed,
median of --runs. It also prints which pytest_sglang modules a plain `import pytest_sglang.plugin` loads for each
variant.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES_PROBE = ("import sys, pytest; before = set(sys.modules); import pytest_sglang.plugin; "
                 "print(len(set(sys.modules) - before), "
                 "sorted(m for m in sys.modules if m.startswith('pytest_sglang')))")


def extract_revision(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "pytest_sglang"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data") if sys.version_info >= (3, 12) else tar.extractall(into)
    return into


def run_env(code: Path, pycache: Path) -> dict[str, str]:
    """The plugin's code on PYTHONPATH, its bytecode cached (as an installed package's is) in a private folder."""
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONPYCACHEPREFIX": str(pycache)}
    for name in ("PYTEST_ADDOPTS", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    return env


def one_run(project: Path, code: Path, disable: bool) -> tuple[float, float]:
    env = run_env(code, project.parent / "pycache")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + (["-p", "no:sglang"] if disable else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=project, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_ms(project: Path, code: Path) -> float:
    """One pytest run under `python -X importtime`: the self time of every pytest_sglang module, summed (ms)."""
    argv = [sys.executable, "-X", "importtime", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    err = subprocess.run(argv, cwd=project, env=run_env(code, project.parent / "pycache"), check=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    rows = (line.split(":", 1)[1].split("|") for line in err.splitlines() if line.startswith("import time:"))
    return sum(int(own) for own, _, name in rows if name.strip().startswith("pytest_sglang")) / 1e3


def loaded_modules(project: Path, code: Path) -> str:
    env = run_env(code, project.parent / "pycache")
    return subprocess.run([sys.executable, "-c", MODULES_PROBE], cwd=project, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rev", help="also measure the plugin of this git revision")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
        variants: dict[str, tuple[Path, bool]] = {"no:sglang": (REPO, True), "current": (REPO, False)}
        if args.rev:
            variants[args.rev] = (extract_revision(args.rev, Path(tmp) / "rev"), False)
        for code, _ in variants.values():
            one_run(project, code, disable=False)  # warm the page cache and the .pyc files
        walls: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, (code, disable) in variants.items():
                wall, cpu = one_run(project, code, disable)
                walls[name].append(wall)
                cpus[name].append(cpu)
        plugin_variants = {name: code for name, (code, disable) in variants.items() if not disable}
        imports: dict[str, list[float]] = {name: [] for name in plugin_variants}
        for _ in range(args.runs):
            for name, code in plugin_variants.items():
                imports[name].append(import_ms(project, code))
        modules = {name: loaded_modules(project, code) for name, code in plugin_variants.items()}
    base_wall, base_cpu = statistics.median(walls["no:sglang"]), statistics.median(cpus["no:sglang"])
    print(f"{args.runs} runs each, interleaved; load average {os.getloadavg()[0]:.2f}")
    print(f"{'variant':<14} {'wall ms':>8} {'+ms':>6} {'cpu ms':>8} {'+ms':>6}   paired +ms (wall, cpu)")
    for name in variants:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        paired = [statistics.median(a - b for a, b in zip(runs[name], runs["no:sglang"], strict=True)) * 1e3
                  for runs in (walls, cpus)]
        print(f"{name:<14} {wall * 1e3:8.0f} {(wall - base_wall) * 1e3:6.0f} {cpu * 1e3:8.0f} "
              f"{(cpu - base_cpu) * 1e3:6.0f}   {paired[0]:6.0f} {paired[1]:6.0f}")
    for name, values in imports.items():
        print(f"python -X importtime, pytest_sglang modules' own import time ({name}): median "
              f"{statistics.median(values):.1f} ms (min {min(values):.1f}, max {max(values):.1f})")
    for name, line in modules.items():
        print(f"import pytest_sglang.plugin ({name}): modules added, pytest_sglang ones: {line}")
    if args.out:
        args.out.write_text(json.dumps({"runs": args.runs, "wall": walls, "cpu": cpus, "import_ms": imports,
                                        "modules": modules},
                                       indent=1))


if __name__ == "__main__":
    main()
