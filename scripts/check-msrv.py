#!/usr/bin/env python3
"""Checks that the workspace's `rust-version` is true of its dependency tree.

Every workspace crate must inherit the workspace's `rust-version`, and no crate that a
dependent (or `cargo install`) builds, the normal and build dependencies of the
workspace's crates, may need a newer Rust: by its declared `rust-version` or by its
edition (2024 needs 1.85, 2021 needs 1.56). Dev-dependencies (the tests' tools) are
listed when they need more, but do not fail the check: the promise is about building
the crates, not their test suites.

    scripts/check-msrv.py           the versions in Cargo.lock
    scripts/check-msrv.py --fresh   the versions a new user gets today: the newest ones
                                    that match the requirements, resolved without
                                    regard to rust-version (as cargo does for an edition
                                    2021 project), in a copy of the workspace

This reads what crates declare; a crate that uses a newer feature than it declares is
caught only by building with that toolchain (.ci/run does, where rustup can install it).
Exits 1 with the offenders listed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

EDITION_NEEDS = {"2015": (1, 0), "2018": (1, 31), "2021": (1, 56), "2024": (1, 85)}


def version(text):
    """'1.85' or '1.85.0' -> (1, 85)."""
    parts = [int(p) for p in text.split(".")[:2]]
    return tuple(parts + [0] * (2 - len(parts)))


def shown(v):
    return "%d.%d" % v


def needs(pkg):
    """What Rust a package needs by its declarations, and why."""
    edition = EDITION_NEEDS.get(pkg["edition"], (1, 0))
    declared = version(pkg["rust_version"]) if pkg.get("rust_version") else None
    if declared and declared >= edition:
        return declared, "rust-version " + pkg["rust_version"]
    return edition, "edition " + pkg["edition"]


def check(root):
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    members = meta["workspace_members"]
    problems = []

    declared = {packages[m]["name"]: packages[m].get("rust_version") for m in members}
    missing = sorted(n for n, v in declared.items() if not v)
    if missing:
        problems.append("no rust-version (inherit it: rust-version.workspace = true): "
                        + ", ".join(missing))
    values = {v for v in declared.values() if v}
    if len(values) > 1:
        problems.append("the workspace's crates declare different rust-versions: %s" % declared)
    if not values:
        return problems
    msrv = max(version(v) for v in values)

    # Walk the resolve graph from the members: normal and build edges are what building
    # the crates needs; an edge that is only a dev-dependency leads to test tools.
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    build, dev = set(), set()
    stack = list(members)
    while stack:
        pid = stack.pop()
        for dep in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            child = dep["pkg"]
            if kinds - {"dev"}:
                if child not in build:
                    build.add(child)
                    stack.append(child)
            elif pid in members:
                dev.add(child)
    # The dev-dependencies' own trees, less what building needs anyway.
    stack = list(dev)
    while stack:
        pid = stack.pop()
        for dep in nodes[pid]["deps"]:
            if dep["pkg"] not in dev:
                dev.add(dep["pkg"])
                stack.append(dep["pkg"])
    dev -= build

    def over(ids):
        rows = []
        for pid in ids:
            p = packages[pid]
            if pid in members:
                continue
            v, why = needs(p)
            if v > msrv:
                rows.append("%s %s needs Rust %s (%s)" % (p["name"], p["version"], shown(v), why))
        return sorted(rows)

    newest = max(((needs(packages[p]), packages[p]["name"]) for p in build if p not in members),
                 default=(((1, 0), "nothing"), "none"))
    print("rust-version %s; the crates' dependencies need at most %s (%s: %s)"
          % (shown(msrv), shown(newest[0][0]), newest[1], newest[0][1]))
    for row in over(build):
        problems.append("a dependency needs a newer Rust than rust-version: " + row)
    for row in over(dev):
        print("note: a dev-dependency (tests only) needs more: " + row)
    return problems


def fresh_copy():
    """A copy of the workspace without its lock file, resolved anew."""
    root = os.getcwd()
    tmp = tempfile.mkdtemp(prefix="cuda-rt-msrv-")
    ignore = shutil.ignore_patterns("target", ".git", "gpu-bin", "__pycache__", "*.so")
    dest = os.path.join(tmp, "ws")
    shutil.copytree(root, dest, ignore=ignore, symlinks=True)
    os.remove(os.path.join(dest, "Cargo.lock"))
    env = dict(os.environ, CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS="allow")
    r = subprocess.run(["cargo", "generate-lockfile"], cwd=dest, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(tmp)
        return None, tmp, r.stderr.strip().splitlines()[-1:] or ["cargo generate-lockfile failed"]
    return dest, tmp, None


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    tmp = None
    if "--fresh" in sys.argv[1:]:
        where, tmp, err = fresh_copy()
        if where is None:
            print("skipped the fresh resolution: " + " ".join(err))
            return 0
        print("fresh resolution (the newest matching versions):")
    else:
        where = root
    try:
        problems = check(where)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print("error: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
