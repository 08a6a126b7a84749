"""Importing reprokit and asking for help never loads an inference engine, and every command's
--help works, even where no engine is installed. Each check runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import run_cli

ENGINES = ("onnxruntime", "openvino", "tensorrt", "torch")

# Prints, after MARK, the engine modules loaded by the statements before it.
REPORT = (
    "import sys\n"
    "print('@@MARK@@', sorted(m for m in sys.modules if m.split('.')[0] in {engines!r}))\n"
)

HELP = (
    "from reprokit.cli import main\n"
    "try:\n"
    "    main({argv!r})\n"
    "except SystemExit as exc:\n"
    "    assert exc.code in (0, None), exc.code\n"
)

# An interpreter where the engines are not installed: importing one raises ImportError.
BLOCKER = (
    "import sys\n"
    "class _Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in {engines!r}:\n"
    "            raise ImportError(f'{{name}} is blocked for this test')\n"
    "sys.meta_path.insert(0, _Block())\n"
)


def loaded_engines(code: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code + REPORT.format(engines=set(ENGINES))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("@@MARK@@"))
    return eval(line.removeprefix("@@MARK@@ "))


@pytest.mark.parametrize(
    "code",
    [
        "import reprokit\n",
        "import reprokit.cli\nfrom reprokit.cli import cli\n",
        "import reprokit.spec, reprokit.engine.backends, reprokit.errors\n",
    ],
)
def test_import_loads_no_engine(code):
    assert loaded_engines(code) == []


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["backends", "--help"]])
def test_help_loads_no_engine(argv):
    assert loaded_engines(HELP.format(argv=argv)) == []


def test_resolving_backend_classes_loads_no_engine():
    code = (
        "from reprokit.spec import parse_target\n"
        "for s in ['ort', 'emulate:fp16', 'openvino:bf16', 'cmd:true']:\n"
        "    parse_target(s)\n"
    )
    assert loaded_engines(code) == []


def command_names() -> list[str]:
    from reprokit.cli import cli

    return sorted(cli.commands)


def test_every_command_has_working_help(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(engines=set(ENGINES)))
    env = {"PYTHONPATH": str(site)}
    top = run_cli("--help", env=env)
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("Usage: reprokit [OPTIONS] COMMAND [ARGS]...")
    names = command_names()
    assert {"check", "backends"} <= set(names)
    for name in names:
        proc = run_cli(name, "--help", env=env)
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stdout.startswith(f"Usage: reprokit {name} "), (name, proc.stdout)
        assert "Traceback" not in proc.stderr


def test_version():
    import reprokit

    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"reprokit, version {reprokit.__version__}"
