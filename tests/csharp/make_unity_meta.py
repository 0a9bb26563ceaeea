"""Write Unity `.meta` files for every file and folder of the Unity package `unity_plugin/`.

A package installed from a git URL is read-only to Unity: it cannot write the `.meta` files it
would make for a project's own assets, and without them every asset gets a new GUID on every
machine (scenes and prefabs lose their script references). So the package ships them. The GUID
is derived from the path inside the package, so running this again gives the same files: only
new paths get new `.meta` files, and a `.meta` whose asset is gone is removed.

Folders whose name ends in `~` (`Samples~`, `Documentation~`) are ignored by Unity's importer;
they get no `.meta` of their own, but their contents do, so that a sample imported into a
project keeps stable GUIDs.

    python tests/csharp/make_unity_meta.py           # write missing metas, remove orphaned ones
    python tests/csharp/make_unity_meta.py --check   # exit 1 if anything would change
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "unity_plugin"
PACKAGE_NAME = "com.igi.sdk"

# importer block per file kind; Unity writes exactly these defaults for a fresh asset
_TAIL = "  externalObjects: {}\n  userData: \n  assetBundleName: \n  assetBundleVariant: \n"
_IMPORTERS = {
    ".cs": "MonoImporter:\n  externalObjects: {}\n  serializedVersion: 2\n"
           "  defaultReferences: []\n  executionOrder: 0\n  icon: {instanceID: 0}\n"
           "  userData: \n  assetBundleName: \n  assetBundleVariant: \n",
    ".asmdef": "AssemblyDefinitionImporter:\n" + _TAIL,
    ".md": "TextScriptImporter:\n" + _TAIL,
    ".txt": "TextScriptImporter:\n" + _TAIL,
    ".json": "TextScriptImporter:\n" + _TAIL,
}
_DEFAULT = "DefaultImporter:\n" + _TAIL


def guid_for(rel: str) -> str:
    """32 hex digits, stable for a path inside the package (any OS's separators)."""
    return hashlib.md5(f"{PACKAGE_NAME}/{rel}".encode()).hexdigest()


def meta_text(path: Path, rel: str) -> str:
    head = f"fileFormatVersion: 2\nguid: {guid_for(rel)}\n"
    if path.is_dir():
        return head + "folderAsset: yes\n" + _DEFAULT
    if rel == "package.json":
        return head + "PackageManifestImporter:\n" + _TAIL
    return head + _IMPORTERS.get(path.suffix, _DEFAULT)


def assets(root: Path = PACKAGE) -> list[Path]:
    """Every file and folder that needs a `.meta` (hidden files and `~` folders themselves not)."""
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or p.suffix == ".meta":
            continue
        if p.is_dir() and p.name.endswith("~"):
            continue
        out.append(p)
    return out


def plan(root: Path = PACKAGE) -> tuple[dict[Path, str], list[Path]]:
    """(metas to write: path -> text, orphaned metas to remove)."""
    wanted = {p.with_name(p.name + ".meta"): p for p in assets(root)}
    write = {}
    for meta, asset in wanted.items():
        text = meta_text(asset, asset.relative_to(root).as_posix())
        # an existing meta keeps its GUID: Unity (or a person) may have written it
        if not meta.exists():
            write[meta] = text
    orphans = [m for m in sorted(root.rglob("*.meta")) if m not in wanted]
    return write, orphans


def main(argv: list[str]) -> int:
    write, orphans = plan()
    if "--check" in argv:
        for m in write:
            print(f"missing: {m.relative_to(PACKAGE)}")
        for m in orphans:
            print(f"orphaned: {m.relative_to(PACKAGE)}")
        return 1 if write or orphans else 0
    for meta, text in write.items():
        meta.write_text(text, encoding="utf-8", newline="\n")
    for m in orphans:
        m.unlink()
    print(f"{len(write)} written, {len(orphans)} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
