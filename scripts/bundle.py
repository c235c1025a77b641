"""Builds an offline install bundle for a GPU host (``make bundle PY=3.12``).

On a machine that reaches PyPI and Debian, this writes one directory (and a ``.tar.gz`` of it):

    wheels/        RelayRL's wheel and the wheels of every runtime dependency, at the versions of
                   constraints.txt, for the target Python and platform; torch and what only torch
                   pulls in (the CUDA stack, triton, sympy...) are left out: the host brings them.
    redis/bin/     redis-server from Debian's package, and redis/lib/ the shared libraries it needs
                   beyond glibc, unpacked from their Debian packages (``apt-get download``, ``dpkg-deb -x``).
    manifest.json  the Python and platform it was built for, what it holds, what the host must bring.

``scripts/install-offline.sh BUNDLE [VENV]`` installs it with no network and no root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

MIB = 1024 * 1024
# glibc comes from the host (its loader must match), and so does the GCC runtime every Python with
# torch already loads (a newer copy of ours would demand a newer glibc); the rest redis-server links
# is shipped.
HOST_SONAMES = re.compile(
    r"^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.so"
)
GLIBC_VERSION = re.compile(rb"GLIBC_(\d+)\.(\d+)")


@dataclass
class Wheel:
    name: str
    version: str
    file: str
    sha256: str
    size: int


@dataclass
class Manifest:
    python: str  # "3.12"
    python_tag: str  # "cp312"
    platform: str  # "manylinux_2_28_x86_64" (and the older manylinux tags pip accepts under it)
    install: list[str]  # what install-offline.sh asks pip for
    host_requirements: list[str]  # what the host must already have (the venv sees its site-packages)
    host_packages: list[str]  # left out on purpose, with what only they pull in
    # The shipped project's own wheels (RelayRL's), pinned: install-offline.sh puts them into the venv
    # itself, whatever the host's site already holds under their names.
    project: list[str] = field(default_factory=list)
    wheels: list[Wheel] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # reached only through a host package
    redis: dict[str, object] = field(default_factory=dict)
    built_at: str = ""


STARTED = time.monotonic()


def say(message: str) -> None:
    print(f"bundle: [{time.monotonic() - STARTED:5.1f}s] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def target_environment(python: str) -> dict[str, str]:
    env = default_environment()
    env.update(
        python_version=python,
        python_full_version=f"{python}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return env


def platform_tags(platform: str) -> list[str]:
    """``manylinux_2_28_x86_64`` and every older manylinux tag a host of that glibc also runs (newer
    pips expand a --platform this way themselves; 23.x does not)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if m is None:
        return [platform]
    major, minor, arch = int(m[1]), int(m[2]), m[3]
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for glibc, name in legacy.items() if major == 2 and glibc <= minor]


def pip_target_args(python: str, platform: str) -> list[str]:
    tag = "cp" + python.replace(".", "")
    platforms = [arg for p in platform_tags(platform) for arg in ("--platform", p)]
    return [
        "--python-version", python,
        "--implementation", "cp",
        # abi3 wheels (safetensors, tokenizers...) and pure ones fit any CPython of the version
        "--abi", tag, "--abi", "abi3", "--abi", "none",
        *platforms,
        "--only-binary", ":all:",
    ]  # fmt: skip


def resolve(wheels: list[str], constraints: Path | None, python: str, platform: str, work: Path) -> list[dict]:
    """pip's full resolution for ``wheels`` on the target Python and platform (its --report items)."""
    report = work / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--disable-pip-version-check", "--report", str(report), "--target", str(work / "target")]
    cmd += pip_target_args(python, platform)
    if constraints is not None:
        cmd += ["-c", str(constraints)]
    run(cmd + wheels)
    return json.loads(report.read_text())["install"]


def shipped(items: list[dict], roots: Iterable[str], host: Iterable[str], python: str) -> tuple[list[dict], list[str]]:
    """The resolved items reachable from ``roots`` without passing through a ``host`` package, and
    the requirements on host packages met on the way (what the host must already satisfy)."""
    env = target_environment(python)
    by_name = {canonicalize_name(i["metadata"]["name"]): i for i in items}
    host = {canonicalize_name(n) for n in host}
    kept: set[str] = set()
    needs: dict[str, SpecifierSet] = {}
    todo: list[tuple[str, frozenset[str]]] = [(canonicalize_name(r), frozenset()) for r in roots]
    visited: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in visited or name not in by_name:
            continue
        visited.add((name, extras))
        kept.add(name)
        for line in by_name[name]["metadata"].get("requires_dist", []):
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""}):
                continue
            dep = canonicalize_name(req.name)
            if dep in host:
                needs[dep] = needs.get(dep, SpecifierSet()) & req.specifier
            else:
                todo.append((dep, frozenset(req.extras)))
    return [by_name[n] for n in sorted(kept)], [f"{n}{needs[n]}" for n in sorted(needs)]


def download(items: list[dict], local: dict[str, Path], python: str, platform: str, dest: Path) -> None:
    pins = []
    for item in items:
        name = canonicalize_name(item["metadata"]["name"])
        if name in local:
            shutil.copy2(local[name], dest / local[name].name)
        else:
            # The very file pip resolved (no second round of index look-ups, one per package).
            pins.append(f"{item['metadata']['name']} @ {item['download_info']['url']}")
    if pins:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
        run(cmd + pip_target_args(python, platform) + ["-d", str(dest), *pins])


def wheel_records(wheel_dir: Path) -> list[Wheel]:
    records = []
    for path in sorted(wheel_dir.glob("*.whl")):
        name, version = path.name.split("-")[:2]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        records.append(Wheel(canonicalize_name(name), version, path.name, digest, path.stat().st_size))
    return records


def ldd(binary: Path, lib_dir: Path) -> dict[str, str]:
    """soname → resolved path of every library ``binary`` loads (transitively), ours first."""
    out = run(["ldd", str(binary)], capture_output=True, env={**os.environ, "LD_LIBRARY_PATH": str(lib_dir)}).stdout
    libs = {}
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and not HOST_SONAMES.match(parts[0]):
            libs[parts[0]] = parts[parts.index("=>") + 1]
    return libs


def debian_packages(paths: Iterable[str]) -> set[str]:
    """The Debian packages that installed ``paths``, in one ``dpkg -S`` (merged /usr: dpkg may know a
    file under either name, so both are asked)."""
    variants = {}
    for path in paths:
        real = os.path.realpath(path)
        variants[path] = list(dict.fromkeys([real, real.removeprefix("/usr"), "/usr" + real, path]))
    asked = sorted({v for vs in variants.values() for v in vs})
    answer = subprocess.run(["dpkg", "-S", *asked], capture_output=True, text=True).stdout
    owner = {}
    for line in answer.splitlines():
        package, _, path = line.partition(": ")
        owner[path] = package.split(":")[0]
    found = set()
    for path, vs in variants.items():
        package = next((owner[v] for v in vs if v in owner), None)
        if package is None:
            raise RuntimeError(f"no Debian package ships {path}; cannot bundle it")
        found.add(package)
    return found


def unpack_debs(packages: list[str], work: Path) -> dict[str, str]:
    """``apt-get download`` + ``dpkg-deb -x`` of ``packages`` into work/root; package → version."""
    debs = work / "debs"
    debs.mkdir(exist_ok=True)
    # apt drops privileges to _apt for downloads; a private temp dir it cannot write is fine (it
    # falls back to root), the warning is noise.
    run(["apt-get", "download", "-qq", *packages], cwd=debs, capture_output=True)
    versions = {}
    for deb in debs.glob("*.deb"):
        package, version = run(
            ["dpkg-deb", "-W", "--showformat=${Package} ${Version}", str(deb)], capture_output=True
        ).stdout.split()
        if package in packages:
            run(["dpkg-deb", "-x", str(deb), str(work / "root")])
            versions[package] = version
    return versions


def glibc_needed(files: Iterable[Path]) -> str:
    """The newest GLIBC_x.y symbol version any of ``files`` asks for, as "x.y"."""
    found = [(int(m[1]), int(m[2])) for f in files for m in GLIBC_VERSION.finditer(f.read_bytes())]
    major, minor = max(found, default=(2, 17))
    return f"{major}.{minor}"


def bundle_redis(out: Path, work: Path, apt_update: bool) -> dict[str, object]:
    """redis-server and its libraries (beyond glibc) from Debian's packages, into out/redis."""
    if apt_update and os.geteuid() != 0:
        say("not root: using the apt package lists already here (apt-get update needs root)")
    elif apt_update:
        run(["apt-get", "update", "-qq"], capture_output=True)
    system_redis = shutil.which("redis-server")
    if system_redis is None:
        raise RuntimeError("redis-server is not installed here: its libraries are found through it (make setup)")
    root, lib_dir = work / "root", out / "redis" / "lib"
    lib_dir.mkdir(parents=True)
    # The packages of the installed binary and of the libraries it loads here, in one download; the
    # loop below checks the unpacked copy against its own libraries (and fetches any still missing).
    packages = debian_packages([system_redis, *ldd(Path(system_redis), lib_dir).values()])
    versions: dict[str, str] = {}
    binary = out / "redis" / "bin" / "redis-server"
    while True:
        say(f"apt-get download {' '.join(sorted(packages - versions.keys()))}")
        versions |= unpack_debs(sorted(packages - versions.keys()), work)
        if not binary.exists():
            binary.parent.mkdir(parents=True)
            shutil.copy2(root / "usr/bin" / os.path.basename(os.path.realpath(system_redis)), binary)
        libs = ldd(binary, lib_dir)
        missing = {}
        for soname, path in libs.items():
            if not path.startswith(str(lib_dir)):
                unpacked = [p for p in root.rglob(soname)]
                if unpacked:
                    shutil.copy2(unpacked[0].resolve(), lib_dir / soname)
                else:
                    missing[soname] = path
        if not missing:
            break
        packages |= debian_packages(missing.values())
        if packages <= versions.keys():
            raise RuntimeError(f"the Debian packages {sorted(packages)} do not hold {sorted(missing)}")
    shipped_files = [binary, *lib_dir.iterdir()]
    version = run([str(binary), "--version"], capture_output=True, env={"LD_LIBRARY_PATH": str(lib_dir)}).stdout
    return {
        "binary": "redis/bin/redis-server",
        "lib": "redis/lib",
        "version": version.strip(),
        "debian_packages": versions,
        "libraries": sorted(p.name for p in lib_dir.iterdir()),
        "glibc_required": glibc_needed(shipped_files),
    }


def tree_bytes(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def project_files(repo: Path) -> list[Path]:
    """The checkout as git sees it: tracked files and new ones not ignored (no venv, no build output)."""
    listed = run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True).stdout
    return [repo / name for name in listed.split("\0") if name and (repo / name).is_file()]


def build_project_wheel(repo: Path, work: Path) -> Path:
    """RelayRL's wheel, built from a copy of the checkout (setuptools writes build/ into its source)."""
    src = work / "src"
    for path in project_files(repo):
        target = src / path.relative_to(repo)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps"]
    run([*cmd, "--no-build-isolation", "-w", str(work), str(src)])
    return next(work.glob("relayrl-*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="target Python, e.g. 3.12")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="pip platform tag of the host")
    parser.add_argument("--out", type=Path, required=True, help="bundle directory (replaced)")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--constraints", type=Path, help="exact versions (the repo's constraints.txt)")
    parser.add_argument("--wheel", type=Path, action="append", help="ship this wheel instead of RelayRL's")
    parser.add_argument(
        "--with",
        dest="also",
        action="append",
        default=[],
        help="also ship and install this requirement (repeat), e.g. pytest for `pytest -m gpu` on the host",
    )
    parser.add_argument(
        "--host-package",
        action="append",
        default=None,
        help="a package the host brings (repeat; default torch): left out with what only it pulls in",
    )
    parser.add_argument("--no-apt-update", action="store_true", help="use the apt lists already here")
    parser.add_argument("--budget-mib", type=float, default=64.0, help="source + bundle must fit (0: no check)")
    args = parser.parse_args(argv)

    args.host_package = args.host_package or ["torch"]
    if not re.fullmatch(r"3\.\d+", args.python):
        parser.error(f"--python must look like 3.12, got {args.python!r}")
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        wheels = args.wheel or [build_project_wheel(args.repo, work)]
        local = {canonicalize_name(w.name.split("-")[0]): w.resolve() for w in wheels}
        project = sorted(f"{name}=={wheel.name.split('-')[1]}" for name, wheel in local.items())
        say(f"resolving {', '.join([*sorted(local), *args.also])} for Python {args.python} on {args.platform}")
        also = [canonicalize_name(Requirement(r).name) for r in args.also]
        roots = [str(w) for w in local.values()] + args.also
        items = resolve(roots, args.constraints, args.python, args.platform, work)
        kept, host_reqs = shipped(items, [*local, *also], args.host_package, args.python)
        say(
            f"downloading {len(kept)} wheels (left out with the host's {', '.join(args.host_package)}: "
            f"{len(items) - len(kept)})"
        )
        download(kept, local, args.python, args.platform, out / "wheels")
        say("unpacking redis-server and its libraries from Debian's packages")
        manifest = Manifest(
            python=args.python,
            python_tag="cp" + args.python.replace(".", ""),
            platform=args.platform,
            install=sorted([*project, *also]),
            project=project,
            host_requirements=host_reqs,
            host_packages=sorted(canonicalize_name(n) for n in args.host_package),
            wheels=wheel_records(out / "wheels"),
            left_out=sorted(canonicalize_name(i["metadata"]["name"]) for i in items if i not in kept),
            redis=bundle_redis(out, work, apt_update=not args.no_apt_update),
            built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
    say("writing the manifest and the tarball")
    (out / "manifest.json").write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    tarball = out.with_name(out.name + ".tar.gz")
    with tarfile.open(tarball, "w:gz", compresslevel=6) as tar:  # tarfile's default 9 is much slower, hardly smaller
        tar.add(out, arcname=out.name)

    bundle = tree_bytes(out.rglob("*"))
    source = tree_bytes(project_files(args.repo))
    sizes = {
        "bundle_dir": str(out),
        "tarball": str(tarball),
        "bundle_mib": round(bundle / MIB, 1),
        "tarball_mib": round(tarball.stat().st_size / MIB, 1),
        "source_mib": round(source / MIB, 1),
        "total_mib": round((bundle + source) / MIB, 1),
        "wheels": len(manifest.wheels),
        "left_out": manifest.left_out,
    }
    print(json.dumps(sizes))
    if args.budget_mib and bundle + source > args.budget_mib * MIB:
        print(
            f"bundle: source + bundle is {sizes['total_mib']} MiB, over the {args.budget_mib} MiB budget",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
