"""The package as a typed user sees it: every name of ``lerobot_dali.__all__`` is there and says what it is, every type
a public signature asks for is importable from the package itself, the options with a fixed set of values take their
values as ``Literal`` strings a type checker checks, and no public signature loses its annotations.

``CpuDecodeOptions(backend="pyav")``, as its docstring spells it, failed ``mypy --strict`` (the field was typed
``CpuDecoderBackend``) while ``decode="gpuu"``, ``rank_balance="pads"``, ``timestamp_source="frame"`` and
``depth_unit="cm"`` passed it (typed ``str``), as did every misspelt keyword of a mixture (``**options: Any``): a user
script caught 2 of 9 such misspellings, and those only because every string was refused; 9 of 9 now. The iterator's
``cpu_decode``, ``depth_unit`` and the augmentation's parts were typed by classes the package did not export, and its
module ``__getattr__`` made a misspelt ``from lerobot_dali import ...`` an ``object`` to a type checker, not an error.
"""

from __future__ import annotations

import ast
import enum
import inspect
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import typing_extensions

import lerobot_dali

#: Classes users build through a function, never by their constructor: :func:`~lerobot_dali.open_dataset` and
#: :func:`~lerobot_dali.concat_datasets` (their constructors take the package's internals).
BUILT_BY_FUNCTIONS = ("LeRobotDatasetReader", "DatasetUnion")
#: Dunder methods of the public classes a user calls (``iter(it)``, ``len(it)``, ``with it:``).
PUBLIC_DUNDERS = ("__init__", "__iter__", "__next__", "__len__", "__enter__", "__exit__")


def _exported() -> Iterator[tuple[str, Any]]:
    for name in lerobot_dali.__all__:
        yield name, getattr(lerobot_dali, name)


def _own_classes() -> list[type]:
    return [
        value for _, value in _exported()
        if inspect.isclass(value) and value.__module__.startswith("lerobot_dali")
    ]  # fmt: skip


def _public_callables(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The methods and properties ``cls`` itself defines that a user calls."""
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in PUBLIC_DUNDERS:
            continue
        if isinstance(member, property) and member.fget is not None:
            yield name, member.fget
        elif isinstance(member, classmethod | staticmethod):
            yield name, member.__func__
        elif inspect.isfunction(member) and member.__module__.startswith("lerobot_dali"):
            yield name, member


def test_every_exported_name_is_there_and_documented() -> None:
    """Each name of ``__all__`` is the package's, its classes and functions with a docstring of their own whose first
    line says what they are (not one inherited from ``Exception``, ``Enum`` or ``object``)."""
    assert sorted(lerobot_dali.__all__) == lerobot_dali.__all__ and len(set(lerobot_dali.__all__)) > 50
    for name, value in _exported():
        if inspect.isclass(value) or inspect.isfunction(value):
            own = value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__
            assert own and own.strip().splitlines()[0].strip(), f"{name} has no docstring of its own"


def test_the_literal_names_spell_their_enums_values() -> None:
    """Each ``...Name`` alias is its enum's values, so a type checker takes every value the enum has and no other;
    the run-time check still takes a value in any case, or a member, and hands back the member."""
    pairs = {
        lerobot_dali.CpuDecoderBackendName: lerobot_dali.CpuDecoderBackend,
        lerobot_dali.ColorConversionName: lerobot_dali.ColorConversion,
        lerobot_dali.DecodePreferenceName: lerobot_dali.DecodePreference,
        lerobot_dali.DepthUnitName: lerobot_dali.DepthUnit,
        lerobot_dali.RankBalanceName: lerobot_dali.RankBalance,
        lerobot_dali.TimestampSourceName: lerobot_dali.TimestampSource,
    }
    named = {name for name, value in _exported() if typing.get_origin(value) is Literal}
    assert named == {f"{kind.__name__}Name" for kind in pairs.values()}
    for alias, kind in pairs.items():
        assert list(typing.get_args(alias)) == [member.value for member in kind], kind
    options = lerobot_dali.CpuDecodeOptions(backend="PyAV", color_conversion=lerobot_dali.ColorConversion.WORKER)
    assert options.backend is lerobot_dali.CpuDecoderBackend.PYAV
    assert options.color_conversion is lerobot_dali.ColorConversion.WORKER


def _named_types(hint: Any) -> Iterator[Any]:
    """The classes (the package's generic ones by their origin) and the ``Literal`` types ``hint`` names."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        yield hint
    elif origin is not None:
        if isinstance(origin, type):
            yield origin
        for arg in typing.get_args(hint):
            yield from _named_types(arg)
    elif isinstance(hint, list):  # (a Callable's parameters)
        for arg in hint:
            yield from _named_types(arg)
    elif isinstance(hint, type):
        yield hint


def _built_by_its_constructor(name: str, value: Any) -> bool:
    """Whether ``value`` is a class a user builds by calling it (not an exception, an enum, or a reader)."""
    if not inspect.isclass(value) or issubclass(value, BaseException | enum.Enum) or name in BUILT_BY_FUNCTIONS:
        return False
    return "__init__" in vars(value)


def _signatures() -> Iterator[tuple[str, Callable[..., Any]]]:
    """The functions a user calls, and the constructors of the classes a user builds."""
    for name, value in _exported():
        if inspect.isfunction(value):
            yield name, value
        elif _built_by_its_constructor(name, value):
            yield f"{name}.__init__", value.__init__


def test_the_types_a_user_names_are_exported() -> None:
    """Every class of the package that a public function or constructor takes or returns (an options class, an enum,
    a union of datasets) is importable from ``lerobot_dali`` as itself, and every ``Literal`` of several values it
    takes is one of the exported ``...Name`` aliases, so a user's own wrapper can annotate what it passes on (a single
    value, ``normalize="stats"``, is written as it is)."""
    aliases = [value for _, value in _exported() if typing.get_origin(value) is Literal]
    seen = set()
    for where, function in _signatures():
        # (the mixture's **options is typed Unpack[MixtureOptions], whose Unpack only a type checker imports)
        hints = typing.get_type_hints(function, localns={"Unpack": typing_extensions.Unpack})
        for hint in hints.values():
            for named in _named_types(hint):
                if typing.get_origin(named) is Literal:
                    assert len(typing.get_args(named)) == 1 or named in aliases, (
                        f"{where} takes {named}, which no exported alias spells"
                    )
                elif named.__module__.startswith("lerobot_dali"):
                    assert getattr(lerobot_dali, named.__name__, None) is named, f"{where}: {named} is not exported"
                    seen.add(named.__name__)
    assert {"CpuDecodeOptions", "AugmentConfig", "DepthUnit", "DatasetUnion", "MixtureOptions", "Normalize"} <= seen


def test_public_signatures_keep_their_annotations() -> None:
    """Every parameter and return of the exported functions, and of the methods and properties the exported classes
    define, is annotated: one that loses its annotation turns into ``Any`` in a typed user's code."""
    bare = []
    callables = [(name, value) for name, value in _exported() if inspect.isfunction(value)]
    for cls in _own_classes():
        callables += [(f"{cls.__name__}.{name}", member) for name, member in _public_callables(cls)]
    for where, function in callables:
        signature = inspect.signature(function)
        if signature.return_annotation is inspect.Signature.empty:
            bare.append(f"{where} -> ?")
        for position, (name, parameter) in enumerate(signature.parameters.items()):
            if parameter.annotation is inspect.Parameter.empty and not (position == 0 and name in ("self", "cls")):
                bare.append(f"{where}({name})")
    assert len(callables) > 100 and not bare, bare


def test_a_mixture_takes_the_iterators_options_as_typed() -> None:
    """:class:`~lerobot_dali.MixtureOptions` (the mixture's ``**options``) holds exactly the iterator's arguments a
    mixture passes on, each typed as the iterator types it (but ``rank_balance``, of fewer values: below)."""
    from lerobot_dali import mixture

    iterator = inspect.signature(lerobot_dali.DALILeRobotIterator.__init__).parameters
    passed = set(iterator) - mixture._OWN_ARGUMENTS - mixture._OPENING_ARGUMENTS - {"self"}
    typed = {name: ref.__forward_arg__ for name, ref in lerobot_dali.MixtureOptions.__annotations__.items()}
    assert set(typed) == passed
    typed.pop("rank_balance")
    assert {name: iterator[name].annotation for name in passed - {"rank_balance"}} == typed
    options = inspect.signature(lerobot_dali.DALILeRobotMixture.__init__).parameters["options"]
    assert options.annotation == "Unpack[MixtureOptions]"


def test_a_misspelt_name_is_an_error_to_a_type_checker() -> None:
    """The package's lazy ``__getattr__`` (DALI loads with the iterator) is hidden from type checkers, which see each
    lazy name imported instead: a module ``__getattr__`` made every misspelt ``from lerobot_dali import X`` an
    ``object`` to mypy, not an error."""
    tree = ast.parse(Path(lerobot_dali.__file__).read_text())
    [checking] = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    assert not any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body)
    assert any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in checking.orelse)
    imported = {alias.name for node in checking.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    lazy = set(lerobot_dali.__all__) - set(vars(lerobot_dali))  # (the names not imported yet, before their use)
    assert lazy <= imported and imported <= set(lerobot_dali.__all__)


def test_dir_lists_the_names_imported_on_first_use() -> None:
    """``dir(lerobot_dali)`` (an IDE's or a REPL's completion, ``help``) lists the names its ``__getattr__`` imports on
    first use, as it lists every other exported name, without importing them."""
    listed = dir(lerobot_dali)
    assert [name for name in lerobot_dali.__all__ if name not in listed] == []
    assert listed == sorted(listed)


def test_the_mixtures_annotations_resolve_at_run_time() -> None:
    """``typing.get_type_hints`` of the mixture's constructor (which CLI builders and run-time type checkers read, as
    they read the iterator's) resolves its ``**options: Unpack[MixtureOptions]``, and those of ``MixtureOptions``:
    ``Unpack`` was imported for type checkers alone, a NameError at run time."""
    hints = typing.get_type_hints(lerobot_dali.DALILeRobotMixture.__init__)
    assert typing_extensions.get_args(hints["options"]) == (lerobot_dali.MixtureOptions,)
    assert hints["batch_size"] is int
    # (the options' own, as pydantic's TypeAdapter or a CLI builder reads them: their types were imported for type
    # checkers alone, a NameError naming torch)
    options = typing.get_type_hints(lerobot_dali.MixtureOptions)
    assert set(options) == set(lerobot_dali.MixtureOptions.__annotations__)
    assert typing_extensions.get_args(options["decode"])[0] is lerobot_dali.DecodePreference


def _values_taken(hint: Any) -> set[Any]:
    """The values a hint of enums and ``Literal`` strings takes: every member of an enum, every ``Literal``'s value."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return set(hint)
    if typing.get_origin(hint) is Literal:
        return set(typing.get_args(hint))
    return {value for arg in typing.get_args(hint) for value in _values_taken(arg)}


def test_a_mixtures_rank_balance_is_typed_with_the_values_a_mixture_takes() -> None:
    """``DALILeRobotMixture(paths, rank_balance="none")`` passed a type checker (``MixtureOptions`` typed it as the
    iterator does, ``RankBalance | RankBalanceName``) and was refused at run time: a mixture's every batch holds a
    share of each dataset. Its type now takes the 4 values a mixture takes (2 spellings of 2 policies), of 6."""
    taken = _values_taken(typing.get_type_hints(lerobot_dali.MixtureOptions)["rank_balance"])
    balance = lerobot_dali.RankBalance
    assert taken == {balance.PAD, balance.DROP, "pad", "drop"}
    for refused in (balance.NONE, "none"):
        with pytest.raises(ValueError, match="reads one dataset or a union"):
            lerobot_dali.DALILeRobotMixture([], rank_balance=refused)


def test_the_light_names_load_neither_dali_nor_torch() -> None:
    """``from lerobot_dali import DecodePreferenceName`` (a ``Literal``) loaded DALI (its module probes the GPU), as
    did ``DecodePreference`` and ``MixtureOptions`` (a ``TypedDict``), which then loaded torch alone for its ``device:
    str | torch.device``. Each exported name but the iterator and the mixture now loads neither DALI nor torch; torch
    loads when ``typing.get_type_hints`` resolves ``MixtureOptions``'s ``device``."""
    code = (
        "import sys, typing, lerobot_dali\n"
        "def heavy(): return [m for m in ('torch', 'nvidia.dali') if m in sys.modules]\n"
        "for name in set(lerobot_dali.__all__) - {'DALILeRobotIterator', 'DALILeRobotMixture'}:\n"
        "    getattr(lerobot_dali, name)\n"
        "    if heavy(): sys.exit(f'{name} loaded {heavy()}')\n"
        "device = typing.get_type_hints(lerobot_dali.MixtureOptions)['device']\n"
        "print(heavy(), device)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.strip()[-200:], done.stdout) == (0, "", "['torch'] str | torch.device\n")
