"""A held-out natural corpus for issue 20: software messages, Spanish -> English, from the
gettext catalogs of Debian's translation packages.

The own-data recipe was built on Multi30k; a corpus it never saw tells whether its defaults
carry over. No corpus can be fetched from the web here, but Debian's archive is reachable, and
its translation packages (LibreOffice, KDE applications, GCC, glibc, GnuPG, libvirt, ...)
hold tens of thousands of human-translated messages: English `msgid`, Spanish `msgstr`. They
are short and technical (menu items, error messages, option help), a different domain, size
and language pair from Multi30k's image captions.

    python bench/gettext_corpus.py --out /tmp/gettext_es_en

`apt-get download`s the packages named in `PACKAGES` (their versions go into
`manifest.json`), reads every `es/LC_MESSAGES/*.mo` with the standard library's `gettext`
(plural forms, empty and untranslated messages left out), drops exact duplicate pairs, and
splits by Spanish text with `--seed`: `--valid` and `--test` Spanish sources (compared as
`aiayn data check` compares them) with all their pairs, none of them anywhere in training.
Written: train/valid/test `.es` and `.en`, one message a line (internal whitespace runs,
newlines included, become one space; accelerator marks such as `_File` are kept as the
catalogs have them), and `manifest.json`. Prints the manifest as JSON.
"""

from __future__ import annotations

import argparse
import gettext
import hashlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from aiayn.atomic import atomic_write_text
from aiayn.text.check import normalise

# Packages that carry only translations, so the download is small; each holds es catalogs.
PACKAGES = (
    "libreoffice-l10n-es", "paperwork-gtk-l10n-es", "aegisub-l10n", "cflow-l10n",
    "cinnamon-l10n", "claws-mail-i18n", "debconf-i18n", "e2fsprogs-l10n", "gcc-12-locales",
    "gdbm-l10n", "libc-l10n", "gnupg-l10n", "gutenprint-locales", "k3b-i18n", "kdevelop-l10n",
    "kdevelop-php-l10n", "kdevelop-python-l10n", "libkchart2-l10n", "libkgantt2-l10n",
    "kile-l10n", "krita-l10n", "libgpg-error-l10n", "libgphoto2-l10n", "libktorrent-l10n",
    "libosinfo-l10n", "libvirt-l10n", "menu-l10n", "libokteta-l10n", "otb-i18n",
    "libparted-i18n", "rpm-i18n", "sylpheed-i18n",
)  # fmt: skip


def catalog_pairs(mo: Path) -> list[tuple[str, str]]:
    """(Spanish, English) pairs of one compiled catalog: singular, translated messages."""
    with mo.open("rb") as f:
        catalog = gettext.GNUTranslations(f)._catalog  # the parsed .mo; no pickle involved
    pairs = []
    for key, value in catalog.items():
        if isinstance(key, tuple) or not key or not value:  # plural forms; the header
            continue
        en = " ".join(key.split("\x04", 1)[-1].split())  # msgctxt \x04 msgid
        es = " ".join(value.split())
        if en and es and en != es:
            pairs.append((es, en))
    return pairs


def download(workdir: Path) -> dict[str, str]:
    """The packages' .deb files in `workdir`; returns package -> version."""
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    versions = {}
    for deb in sorted(workdir.glob("*.deb")):
        fields = subprocess.run(["dpkg-deb", "--field", str(deb), "Package", "Version"],
                                check=True, capture_output=True, text=True).stdout  # fmt: skip
        found = dict(line.split(": ", 1) for line in fields.splitlines())
        versions[found["Package"]] = found["Version"]
    return versions


def extract(workdir: Path) -> list[Path]:
    root = workdir / "root"
    root.mkdir()
    for deb in sorted(workdir.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return sorted(p for p in root.rglob("*.mo") if p.parent.parent.name == "es")


def split(pairs: list[tuple[str, str]], n_valid: int, n_test: int, seed: int) -> dict:
    """Held-out sets chosen by Spanish text as `aiayn data check` compares it (case, punctuation
    and accelerator marks aside), so none of their sources is in training, nor in the other."""
    sources = sorted({normalise(es) for es, _ in pairs})
    random.Random(seed).shuffle(sources)
    held: dict[str, str] = {}
    for name, n in (("valid", n_valid), ("test", n_test)):
        for es in sources[len(held) : len(held) + n]:
            held[es] = name
    parts: dict[str, list[tuple[str, str]]] = {"train": [], "valid": [], "test": []}
    for es, en in pairs:
        parts[held.get(normalise(es), "train")].append((es, en))
    for part in parts.values():
        random.Random(seed).shuffle(part)
    return parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--valid", type=int, default=2000, help="Spanish sources held out: validation")
    p.add_argument("--test", type=int, default=2000, help="Spanish sources held out: test")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            versions = download(Path(tmp))
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"error: apt-get download failed ({e}); this needs Debian's archive")
        catalogs = extract(Path(tmp))
        pairs = sorted({pair for mo in catalogs for pair in catalog_pairs(mo)})
    parts = split(pairs, args.valid, args.test, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, part in parts.items():
        for lang, i in (("es", 0), ("en", 1)):
            text = "".join(pair[i] + "\n" for pair in part)
            atomic_write_text(args.out / f"{name}.{lang}", text)
            files[f"{name}.{lang}"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    manifest = {"corpus": "Debian gettext catalogs, es -> en", "packages": versions,
                "catalogs": len(catalogs), "unique_pairs": len(pairs),
                "pairs": {k: len(v) for k, v in parts.items()}, "seed": args.seed,
                "sha256_16": files}  # fmt: skip
    atomic_write_text(args.out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
