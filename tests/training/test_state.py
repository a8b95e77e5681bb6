"""The trainer's state is declared (attnkit.training.state): one writer per field.

``Setup`` and ``Progress`` are frozen values; :class:`attnkit.training.loop.Trainer` declares every field it has in
``__init__`` and is the only code that assigns them: no other module assigns an attribute of a trainer."""

import ast
import dataclasses
from pathlib import Path

import pytest
from train_helpers import quiet, small_config

import attnkit
from attnkit.training import Trainer, train
from attnkit.training.state import Progress, Setup

SRC = Path(attnkit.__file__).parent
OWNERS = {SRC / "training" / "loop.py", SRC / "training" / "state.py"}


def _trainer_names(func: ast.AST) -> set[str]:
    """The names a function gives a trainer: a parameter called ``trainer`` or annotated ``Trainer``."""
    args = func.args
    names = set()
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        if arg.arg == "trainer" or annotation.strip("'\"").split(".")[-1] == "Trainer":
            names.add(arg.arg)
    return names


def trainer_writes(source: str) -> list[str]:
    """Every ``trainer.x = ...`` (also augmented, annotated, ``with ... as trainer.x``, ``for trainer.x in``, and
    ``setattr(trainer, ...)``) in ``source``, where ``trainer`` is a function's trainer parameter or a variable
    bound to ``Trainer(...)``."""
    tree, found = ast.parse(source), []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
            continue
        names = set() if isinstance(func, ast.Module) else _trainer_names(func)
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    ast.unparse(node.value.func).split(".")[-1] == "Trainer":
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(func):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
                targets = [node.target]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets = [node.optional_vars]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "object.__setattr__") \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in names:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in names:
                        found.append(f"line {sub.lineno}: {ast.unparse(sub)}")
    return found


def test_no_module_outside_the_loop_and_the_state_assigns_a_trainer_attribute():
    offenders = {str(path.relative_to(SRC)): writes for path in sorted(SRC.rglob("*.py")) if path not in OWNERS
                 for writes in [trainer_writes(path.read_text())] if writes}
    assert offenders == {}


def test_the_scan_can_fail():
    assert trainer_writes("def f(trainer):\n    trainer.step = 1\n") == ["line 2: trainer.step"]
    assert trainer_writes("def f(t: 'Trainer'):\n    t.metrics += 1\n") == ["line 2: t.metrics"]
    assert trainer_writes("def f(trainer):\n    with x() as trainer.stop:\n        pass\n") == ["line 2: trainer.stop"]
    assert trainer_writes("def f(trainer):\n    setattr(trainer, 'a', 1)\n") == ["line 2: setattr(trainer, 'a', 1)"]
    assert trainer_writes("t = Trainer(c)\nt.step = 3\n") == ["line 2: t.step"]
    assert trainer_writes("def f(trainer):\n    trainer.model.train()\n    x = trainer.step\n") == []


def _self_writes(method: ast.FunctionDef) -> set[str]:
    return {sub.attr for node in ast.walk(method) for sub in ast.walk(node)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.withitem))
            and isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
            and isinstance(sub.ctx, ast.Store)}


def test_the_trainer_declares_every_field_in_init():
    tree = ast.parse((SRC / "training" / "loop.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    methods = {n.name: n for n in trainer.body if isinstance(n, ast.FunctionDef)}
    declared = _self_writes(methods["__init__"])
    later = {name: _self_writes(m) - declared for name, m in methods.items() if name != "__init__"}
    assert {name: sorted(fields) for name, fields in later.items() if fields} == {}
    assert {"setup", "progress"} <= declared


def test_setup_and_progress_are_frozen_values(tmp_path):
    trainer = Trainer(small_config(tmp_path / "run", steps=2), log=quiet)
    try:
        assert isinstance(trainer.setup, Setup) and isinstance(trainer.progress, Progress)
        for value, field in ((trainer.setup, "model"), (trainer.progress, "step")):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(value, field, None)
        before = set(vars(trainer))
        with pytest.raises(AttributeError):  # the hook API reads the state; it cannot write it
            trainer.step = 5
    finally:
        trainer.close()
    assert set(vars(trainer)) == before


def test_hooks_read_the_run_through_the_trainers_properties(tmp_path):
    seen = []

    def hook(trainer, entry):
        seen.append((trainer.step, entry["step"], trainer.total_steps, trainer.precision, trainer.run_dir,
                     trainer.config.steps, trainer.device.type, trainer.model is trainer.setup.model,
                     trainer.val_data.num_rows > 0, len(trainer.run_id)))

    result = train(small_config(tmp_path / "run", steps=3), log=quiet, hooks=[hook])
    assert result.step == 3
    assert seen == [(s, s, 3, "fp32", tmp_path / "run", 3, "cpu", True, True, 32) for s in (1, 2, 3)]
