"""Pack `vllm bench serve`'s client (vllm.benchmarks.serve, random dataset, OpenAI /v1/completions) into a slim,
pure-Python tree that runs on the lent H200 host, which has no vllm and no network.

    python benchmarks/gpu_h200/pack_vllm_client.py --vllm-python DEST/vllm/bin/python   # .ci/install-servers.sh's
    # then, on the host: PYTHONPATH=$PWD/.whl-vllm python3 benchmarks/client_ceiling.py --vllm-python python3 ...

The real vLLM wheel is hundreds of MB and its package __init__, platform detection and config modules pull in
torch, pydantic, msgspec, zmq and vllm._C; the benchmark client needs none of them. So the tree holds:
- REAL: vllm's own files, byte for byte, from the vllm whose version is reported (vllm/benchmarks/serve.py,
  datasets/, lib/, and the small helpers they import: envs, logger, tokenizers, repo_utils, ...);
- STUBS: a few modules written here in place of vllm's, each saying why: package __init__ files that would
  start the engine, names the random dataset never reaches (LoRA, audio/image fetching) as placeholders that
  raise NotInSlimClient when used, and single functions copied verbatim out of a heavy module (excerpts);
- pybase64's pure-Python fallback (the image lacks pybase64; its C extension is left out, and pybase64 falls
  back to its own pure-Python code), from the wheel fetched with the device README's `pip download` recipe.
No .so file is copied. The tree's size is printed at the end.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import runpy
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REAL = (
    "vllm.version", "vllm._version", "vllm.envs", "vllm.exceptions", "vllm.logger",
    "vllm.logging_utils", "vllm.logging_utils.formatter", "vllm.logging_utils.lazy", "vllm.logging_utils.log_time",
    "vllm.logging_utils.torch_tensor", "vllm.logging_utils.uvicorn_logging",
    "vllm.benchmarks", "vllm.benchmarks.serve", "vllm.benchmarks.datasets", "vllm.benchmarks.datasets.datasets",
    "vllm.benchmarks.datasets.utils", "vllm.benchmarks.lib", "vllm.benchmarks.lib.endpoint_request_func",
    "vllm.benchmarks.lib.ready_checker", "vllm.benchmarks.lib.utils",
    "vllm.inputs", "vllm.inputs.engine", "vllm.inputs.llm", "vllm.lora",
    "vllm.multimodal.image",
    "vllm.tokenizers", "vllm.tokenizers.hf", "vllm.tokenizers.protocol", "vllm.tokenizers.registry",
    "vllm.transformers_utils", "vllm.transformers_utils.repo_utils",
    "vllm.utils.argparse_utils", "vllm.utils.gc_utils", "vllm.utils.import_utils", "vllm.utils.mistral",
)

PACKAGE_WHY = {  # package __init__ files written as a docstring (and PACKAGE_BODY): their submodules import
    "vllm": "vllm/__init__ imports vllm.env_override (torch, the engine's settings); the client needs only "
            "the version",
    "vllm.utils": "vllm/utils/__init__ imports torch; the client uses its submodules only",
    "vllm.distributed": "vllm/distributed/__init__ imports torch.distributed and the communicators; only the "
                        "parallel_state stub below is used",
    "vllm.multimodal": "vllm/multimodal/__init__ imports the multimodal registry (torch); the client uses "
                       "vllm.multimodal.image and the stubs below",
}
PACKAGE_BODY = {"vllm": "from .version import __version__, __version_tuple__  # noqa: F401\n"}


@dataclass(frozen=True)
class Stub:
    """A module written in place of vllm's: ``excerpt`` names copied verbatim out of vllm's own file (with the
    imports and module-level definitions they use), ``absent`` names that raise NotInSlimClient (or the error
    named) when used, ``written`` code of our own."""

    module: str
    why: str
    excerpt: tuple[str, ...] = ()
    absent: dict[str, str] = field(default_factory=dict)
    written: str = ""


STUBS = (
    Stub("vllm.utils.network_utils", "vllm's file imports zmq and psutil at the top; the client calls "
         "join_host_port only", excerpt=("join_host_port",)),
    Stub("vllm.transformers_utils.config", "vllm's file imports torch, safetensors and the engine's config "
         "parsers; the Hugging Face tokenizer loader calls the one function excerpted here, and get_config, "
         "whose ValueError get_tokenizer suppresses (AutoTokenizer then reads config.json itself); "
         "_maybe_register_hf_config is reached only from an engine's ModelConfig",
         excerpt=("get_sentence_transformer_tokenizer_config",),
         absent={"get_config": "ValueError", "_maybe_register_hf_config": "NotInSlimClient"}),
    Stub("vllm.distributed.parallel_state", "vllm.logger's *_once methods ask it whether this process logs "
         "(scope 'local'/'global'); vllm's file imports torch.distributed and the device communicators, and its "
         "answer is True in any process without an initialised torch.distributed group, as a bench client is",
         written="def is_global_first_rank() -> bool:\n    return True\n\n\n"
                 "def is_local_first_rank() -> bool:\n    return True\n"),
    Stub("vllm.lora.request", "vllm's file needs msgspec; the random dataset makes no LoRA request",
         absent={"LoRARequest": "NotInSlimClient"}),
    Stub("vllm.lora.utils", "vllm's file imports torch and the model executor; LoRA adapters are not used",
         absent={"get_adapter_absolute_path": "NotInSlimClient"}),
    Stub("vllm.multimodal.audio", "vllm's file imports torch at the top; the function is pure numpy",
         excerpt=("get_audio_duration",)),
    Stub("vllm.multimodal.utils", "vllm's file imports the multimodal inputs and media loaders (torch); the "
         "random dataset fetches no image", absent={"encode_image_url": "NotInSlimClient",
                                                    "fetch_image": "NotInSlimClient"}),
)

SLIM_MODULE = '''"""What the slim vllm bench client (benchmarks/gpu_h200/pack_vllm_client.py) left out."""


class NotInSlimClient(RuntimeError):
    pass


def absent(module: str, name: str, error: type[Exception] = NotInSlimClient) -> type:
    """A stand-in for ``module.name``: usable in annotations, raising ``error`` when called."""

    def refuse(*args, **kwargs):
        raise error(f"{module}.{name} is not in the slim vllm bench client (random dataset, OpenAI completions "
                    "only): run this benchmark with a full vllm install")

    return type(name, (), {"__new__": refuse, "__module__": module})
'''


class PackError(Exception):
    pass


def ask(python: str, code: str) -> str | None:
    """What ``code`` prints under ``python``, or None where it fails."""
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PackError(f"cannot run {python}: {exc}") from exc
    return proc.stdout.strip() if proc.returncode == 0 else None


def vllm_site(python: str) -> Path:
    """The folder holding vllm's package, found without importing vllm (that would start its engine)."""
    found = ask(python, "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])")
    if not found:
        raise PackError(f"{python} has no vllm package: pass --vllm-python with the interpreter of a venv where "
                        "vllm is installed")
    return Path(found).parent


def source_of(site: Path, module: str) -> Path:
    base = site / module.replace(".", "/")
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    raise PackError(f"{module} not found under {site}: is this the vllm the client was packed against?")


def bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, ast.AnnAssign) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def excerpt(source: str, names: tuple[str, ...]) -> str:
    """``names`` and every top-level statement they use (imports, helpers, constants), verbatim: the imports first,
    then the rest, each in file order."""
    tree = ast.parse(source)
    by_name = {name: stmt for stmt in tree.body for name in bound_names(stmt)}
    conditional = {name for stmt in tree.body if isinstance(stmt, (ast.If, ast.Try))
                   for inner in ast.walk(stmt) if isinstance(inner, ast.stmt) and inner is not stmt
                   for name in bound_names(inner)}
    kept: set[int] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        stmt = by_name.get(name)
        if stmt is None:
            if name in names or name in conditional:
                raise PackError(f"{name} is not an unconditional top-level name of the excerpted module: "
                                "excerpt less, or copy the module whole")
            continue
        if id(stmt) in kept:
            continue
        kept.add(id(stmt))
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            todo.extend(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name))
    kept.update(id(stmt) for stmt in tree.body if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__")
    imports = [stmt for stmt in tree.body if id(stmt) in kept and isinstance(stmt, (ast.Import, ast.ImportFrom))]
    defs = [stmt for stmt in tree.body if id(stmt) in kept and stmt not in imports]
    segment = [ast.get_source_segment(source, stmt) or "" for stmt in imports]
    return "\n".join(segment) + "\n\n\n" + "\n\n\n".join(ast.get_source_segment(source, s) or "" for s in defs)


def stub_source(site: Path, stub: Stub) -> str:
    lines = [f'"""Slim-client stub of {stub.module}: {stub.why}."""', ""]
    if stub.excerpt:
        lines += [f"# excerpted verbatim from vllm's {stub.module.replace('.', '/')}.py",
                  excerpt(source_of(site, stub.module).read_text(), stub.excerpt), "", ""]
    if stub.absent:
        lines.append("from vllm._slim_client import NotInSlimClient, absent  # noqa: F401")
        lines += [f"{name} = absent({stub.module!r}, {name!r}, {error})" for name, error in stub.absent.items()]
    if stub.written:
        lines.append(stub.written)
    return "\n".join(lines) + "\n"


def write(out: Path, relpath: Path, text: str) -> str:
    path = out / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(relpath)


def pack_vllm(site: Path, out: Path) -> dict[str, str]:
    """Writes the vllm part of the tree; returns each file's provenance (vllm's sha256, or why it was stubbed)."""
    made: dict[str, str] = {}
    for module in REAL:
        src = source_of(site, module)
        dst = out / src.relative_to(site)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        made[str(dst.relative_to(out))] = "vllm's own, sha256 " + hashlib.sha256(src.read_bytes()).hexdigest()
    for package, why in PACKAGE_WHY.items():
        made[write(out, Path(package.replace(".", "/")) / "__init__.py",
                   f'"""Slim-client stub of {package}/__init__: {why}."""\n\n{PACKAGE_BODY.get(package, "")}')] = why
    for stub in STUBS:
        made[write(out, Path(stub.module.replace(".", "/") + ".py"), stub_source(site, stub))] = stub.why
    made[write(out, Path("vllm/_slim_client.py"), SLIM_MODULE)] = "the placeholders' NotInSlimClient"
    missing = sorted(str(p.relative_to(out)) for p in (out / "vllm").rglob("*")
                     if p.is_dir() and not (p / "__init__.py").exists())
    if missing:
        raise PackError(f"packages without __init__ in the slim tree: {missing}; add them to REAL or PACKAGE_WHY")
    return made


def installed_version(python: str, dist: str) -> str:
    version = ask(python, f"import importlib.metadata as m; print(m.version({dist!r}))")
    if not version:
        raise PackError(f"{dist} is not installed beside vllm in {python}: vllm's datasets module needs it")
    return version


PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def pack_pybase64(python: str, out: Path) -> str:
    """pybase64's .py files for Python 3.12 on x86-64, as the device README's recipe fetches them."""
    spec = f"pybase64=={installed_version(python, 'pybase64')}"
    with tempfile.TemporaryDirectory(prefix="pack-vllm-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", tmp, spec]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = list(Path(tmp).glob("pybase64-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise PackError(f"pip download {spec} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as whl:
            for name in whl.namelist():
                if name.startswith("pybase64/") and name.endswith((".py", ".typed")):
                    write(out, Path(name), whl.read(name).decode())
        return wheels[0].name


def replace_tree(out: Path, built: Path) -> None:
    """Puts the new tree in place of an earlier slim tree, and of nothing else."""
    if out.exists() and any(out.iterdir()):
        if not (out / "SLIM-MANIFEST.json").is_file():
            raise PackError(f"{out} exists and is not a slim tree (no SLIM-MANIFEST.json): pass another --out, or "
                            "remove it yourself")
        shutil.rmtree(out)
    elif out.exists():
        out.rmdir()
    built.rename(out)


def build(python: str, out: Path) -> str:
    """Writes the tree to ``out``; returns vllm's version."""
    site = vllm_site(python)
    made = pack_vllm(site, out)
    wheel = pack_pybase64(python, out)
    version = runpy.run_path(str(out / "vllm/_version.py"))["__version__"]
    manifest = {"vllm": version, "source": str(site / "vllm"), "pybase64": wheel, "files": made}
    (out / "SLIM-MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    compiled = [str(p) for p in out.rglob("*") if p.suffix in (".so", ".pyd")]
    if compiled:
        raise PackError(f"compiled files in the slim tree: {compiled}")
    return str(version)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", required=True, help="interpreter of a venv with vllm installed")
    ap.add_argument("--out", default=".whl-vllm", help="the slim tree (an earlier one is replaced; default .whl-vllm)")
    args = ap.parse_args()
    out = Path(args.out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    built = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        version = build(args.vllm_python, built)
        replace_tree(out, built)
    except PackError as exc:
        print(f"pack_vllm_client: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(built, ignore_errors=True)
    files = [p for p in out.rglob("*") if p.is_file()]
    print(f"slim vllm {version} bench client: {out}, {len(files)} files, "
          f"{sum(p.stat().st_size for p in files) / 2**20:.2f} MiB ({len(REAL)} of vllm's files as they are, "
          f"{len(STUBS) + len(PACKAGE_WHY)} stubs, pybase64's Python; provenance in {out}/SLIM-MANIFEST.json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
