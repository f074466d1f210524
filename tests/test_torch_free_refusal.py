"""A mistake in a config is refused without importing torch: the components' signatures read from their source
(``rlx_cli.config.signatures.declared``) equal the registered functions' own, and ``rlx train`` with a bad value
imports no torch."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from components import registry
from rlx_cli.config import signatures


def test_declared_signatures_are_the_registered_functions_own():
    declared, registered = signatures.declared(), registry.signatures()
    assert declared.keys() == registered.keys()
    for group, members in registered.items():
        assert declared[group] == members, group
    assert declared["policy_loss"]["ppo_clip"].ranges["clip_ratio_c"] == (1.0, math.inf)
    assert "values" in declared["advantage"]["gae"].parameters  # tensors too: a critic's need is read from them


def test_declared_reads_constants_imported_from_a_sibling_and_names_what_it_cannot(tmp_path):
    package = tmp_path / "parts"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "shared.py").write_text('KINDS = ("a", "b")\nLOW: float = -2**-1\n')
    (package / "sub" / "thing.py").write_text(
        textwrap.dedent("""
        import math
        from parts.shared import KINDS, LOW
        from parts.registry import register

        @register("g", "thing", ranges={"x": (LOW, math.inf)}, choices={"kind": KINDS})
        def thing(t, mask, *, x=1.5, kind="a", scale=2 * 3):
            return t
    """)
    )
    (package / "other.py").write_text('@registry.register("g", "other")\ndef other(t, *, y):\n    return t\n')
    table = signatures.declared(package)
    thing = table["g"]["thing"]
    assert thing.parameters == ("t", "mask", "x", "kind", "scale") and thing.source == "parts.sub.thing.thing"
    assert thing.hyperparameters == {"x": 1.5, "kind": "a", "scale": 6}
    assert thing.ranges == {"x": (-0.5, math.inf)} and thing.choices == {"kind": ("a", "b")}
    assert table["g"]["other"].hyperparameters == {"y": registry.inspect.Parameter.empty}
    (package / "called.py").write_text('@register("g", "called")\ndef called(t, *, z=float("inf")):\n    return t\n')
    with pytest.raises(signatures.Undeclared, match=r"parts.called, line 2: float\('inf'\) is not a literal"):
        signatures.declared(package)


def python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def imported(importtime: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported (its stderr's table)."""
    return {line.split("|")[-1].strip() for line in importtime.splitlines() if line.startswith("import time:")}


def test_a_bad_hyperparameter_is_refused_without_torch():
    out = python("-X", "importtime", "-m", "rlx_cli", "train", "policy_loss.eps_high=-1")
    errors = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert out.returncode == 2 and errors == ["error: policy_loss.eps_high=-1 is out of range (valid: 0.0 to 1.0)"]
    modules = imported(out.stderr)
    assert {"rlx_cli.loops.run", "rlx_cli.config.signatures"} <= modules  # the train path, to the refusal
    assert not {m for m in modules if m == "torch" or m.startswith("torch.")}
    choice = python("-X", "importtime", "-m", "rlx_cli", "train", "kl=estimate", "kl.kind=k9")
    assert choice.returncode == 2 and "kl.kind='k9' is not valid (valid: k1, abs, k2, k3)" in choice.stderr
    assert "torch" not in imported(choice.stderr)
    overlay = python("-X", "importtime", "-m", "rlx_cli", "train", "algo=grpo", "+ablate=no_value_pretrain")
    assert overlay.returncode == 2 and "+ablate=no_value_pretrain does not apply to algo=grpo" in overlay.stderr
    assert "torch" not in imported(overlay.stderr)  # which groups a preset uses: read from the signatures too
    helped = python("-X", "importtime", "-m", "rlx_cli", "--help")
    assert helped.returncode == 0 and "torch" not in imported(helped.stderr)


def test_the_package_imported_later_fills_the_registry_read_on_its_own():
    script = textwrap.dedent("""
        import sys
        from rlx_cli.config import signatures
        alone = signatures.registry()
        assert "components" not in sys.modules and "torch" not in sys.modules
        import components
        from components import registry
        assert registry is alone and components.registry is alone
        assert registry.get("kl", "estimate").__module__ == "components.kl"
        assert signatures.table() == registry.signatures()
    """)
    out = python("-c", script)
    assert out.returncode == 0, out.stderr
