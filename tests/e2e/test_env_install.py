"""The install steps of the deploy files work without a package index name (issue 13 item 5).

`politeproxy` is not on PyPI: `pip install politeproxy` found nothing, and an unclaimed name invites
dependency confusion. Every documented `pip install` names a path or a wheel file; the slow test runs the
systemd steps of deploy/README.md (wheel from the checkout, a virtualenv, the symlinked command) with
``--no-index`` for the package itself.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.processes import ROOT

DOCS = [
    ROOT / "deploy" / "README.md",
    ROOT / "deploy" / "Dockerfile",
    ROOT / "deploy" / "politeproxy.service",
    ROOT / "README.md",
    ROOT / "Makefile",
]


def pip_installs(text: str) -> list[list[str]]:
    """The arguments of every `pip install` command in ``text`` (up to a comment or a shell operator)."""
    out = []
    for m in re.finditer(r"pip3? install ([^\n#`;&|]*)", text):
        out.append(shlex.split(m.group(1).replace("\\", " ")))
    return out


def test_no_documented_pip_install_names_the_package() -> None:
    """No documented `pip install` asks an index for `politeproxy` (bare, with extras or a version);
    the deploy files' installs name a path or a wheel file."""
    seen = 0
    for doc in DOCS:
        for args in pip_installs(doc.read_text()):
            for t in (a for a in args if not a.startswith("-")):
                seen += 1
                name = re.split(r"[\[=<>~!@ ]", t, maxsplit=1)[0].lower()
                assert name not in ("politeproxy", "politeproxy.whl"), f"{doc}: pip install {' '.join(args)}"
                if doc.parent.name == "deploy":
                    assert t.startswith((".", "/", "$")) or t.endswith(".whl"), f"{doc}: {t!r} is not a path"
    assert seen >= 3


def readme_systemd_steps() -> list[str]:
    text = (ROOT / "deploy" / "README.md").read_text()
    section = text[text.index("## systemd") :]
    block = section[section.index("```") + 3 :]
    block = block[: block.index("```")]
    return [line.split("  #")[0].strip() for line in block.strip().splitlines()]


@pytest.mark.slow  # builds a wheel (pip's isolated build) and a virtualenv: about 10 s
def test_the_systemd_install_steps_run(tmp_path: Path) -> None:
    """Run the README's wheel, venv, pip install and ln steps against a copy of the checkout, with
    /opt/politeproxy and /usr/local/bin moved into a temp dir; the command it links answers."""
    steps = readme_systemd_steps()
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "politeproxy", src / "politeproxy", ignore=shutil.ignore_patterns("__pycache__"))
    opt, bindir = tmp_path / "opt" / "politeproxy", tmp_path / "usr-local-bin"
    bindir.mkdir()

    def sh(line: str, extra: str = "") -> None:
        line = line.replace("/opt/politeproxy", str(opt)).replace("/usr/local/bin", str(bindir))
        line = line.replace("python3 ", f"{shlex.quote(sys.executable)} ", 1) + extra
        r = subprocess.run(["bash", "-c", line], cwd=src, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"

    wheel = next(s for s in steps if "pip wheel" in s)
    venv = next(s for s in steps if "-m venv" in s)
    install = next(s for s in steps if "pip install" in s)
    link = next(s for s in steps if s.startswith("ln "))
    sh(wheel)
    assert list((src / "dist").glob("politeproxy-*.whl"))
    sh(venv.replace("python3 -m venv", f"{shlex.quote(sys.executable)} -m venv"))
    # The dependencies come from this test run's environment; the package itself from the wheel only.
    purelib = subprocess.run(
        [str(opt / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    sh(install, " --no-index --no-deps")
    sh(link)
    exe = bindir / "politeproxy"
    version = subprocess.run(
        [str(exe), "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert version.returncode == 0 and version.stdout.startswith("politeproxy "), version.stderr
    where = subprocess.run(
        [str(opt / "bin" / "python"), "-c", "import politeproxy; print(politeproxy.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(str(opt)), where
    check = subprocess.run(
        [str(exe), "check-config", str(ROOT / "deploy" / "politeproxy.toml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
