"""tools/changes.py: which changes between two chapters can reach a test that ran some
functions and reads some names. Each rule, and the way around it it closes."""

from __future__ import annotations

import textwrap
from typing import Dict, Optional

from tools.changes import FileChange, diff, names_in, reaches, summarise, tree_change


def change(old: Optional[str], new: Optional[str]) -> FileChange:
    summary = lambda s: summarise(textwrap.dedent(s)) if s is not None else None  # noqa: E731
    return diff(summary(old), summary(new))


BASE = """
    from typing import List

    LIMIT = 4

    def used(x):
        return x + 1

    class Pool:
        size: int = 8

        def __init__(self, n):
            self.n = n

        def take(self):
            return self.n
    """


def test_a_body_that_changed_is_named_and_formatting_is_not():
    assert change(BASE, BASE.replace("x + 1", "x  +  1  # the same")).bodies == set()
    moved = change(BASE, BASE.replace("return x + 1", "return x + 2"))
    assert moved.bodies == {"used"} and not moved.names and not moved.opaque
    assert change(BASE, BASE.replace("return self.n", "return -self.n")).bodies == {"Pool.take"}


def test_a_new_definition_changes_no_name_but_a_removed_or_resigned_one_does():
    added = change(BASE, BASE + "\n    def extra():\n        return 0\n")
    assert not added.names and not added.bodies
    assert change(BASE, BASE.replace("def used(x)", "def renamed(x)")).names == {"used"}
    assert change(BASE, BASE.replace("def used(x)", "def used(x, y=0)")).names == {"used"}
    # a new import binds a name that nothing could read before
    assert not change(BASE, BASE.replace("import List", "import Dict, List")).names
    # the same name from elsewhere means something else
    assert change(BASE, BASE.replace("from typing import List", "from mylib import List")).names


def test_a_new_method_can_override_one_so_its_name_counts():
    added = change(BASE, BASE + "\n        def free(self):\n            pass\n")
    assert added.names == {".free"}
    # a dunder acts through the class: construction, operators
    dunder = change(BASE, BASE + "\n        def __len__(self):\n            return 0\n")
    assert dunder.names == {"Pool"}
    # a class attribute (a dataclass field) changes the class and the attribute
    assert change(BASE, BASE.replace("size: int = 8", "size: int = 16")).names == {"Pool", ".size"}
    # an abstract method changes the class: a subclass that lacks it can no longer be made
    # (chapter 18's hooks made a test's own backend class abstract)
    with_hook = BASE + "\n        @abstractmethod\n        def hook(self): ...\n"
    assert change(BASE, with_hook).names == {"Pool", ".hook"}
    assert change(with_hook, BASE).names == {"Pool", ".hook"}


def test_a_member_set_on_the_class_after_it_is_defined_changes_that_class_only():
    """Project P1 turns a dataclass field into a property after `@dataclass` made the
    constructor: `Pool.size = property(...)` below the class. A test that never meets `Pool`
    or `.size` cannot see it; before this rule the whole module counted as changed."""
    getter = "\n    def _size(self):\n        return 16\n"
    with_property = BASE + getter + "\n    Pool.size = property(_size)\n"
    assert change(BASE, with_property) == FileChange(
        names={"Pool", ".size"}, owners={".size": {"Pool"}}
    )
    assert change(with_property, with_property.replace("_size)", "_size, None)")).names == {
        "Pool", ".size"
    }  # fmt: skip
    # an attribute of a class that the module did not define is still opaque
    assert change(BASE, BASE + "\n    List.size = property(len)\n").opaque


def test_a_registration_and_a_statement_run_at_import():
    registry = """
        REG = Registry("backends")

        @REG.register("a")
        def make_a():
            return 1
        """
    more = registry + '\n        @REG.register("b")\n        def make_b():\n            return 2\n'
    assert change(registry, more).names == {"REG"}
    assert change(BASE, BASE + "\n    print('hello')\n").opaque
    assert change(BASE, BASE + "\n    import sys\n    sys.flags_x = 1\n").opaque  # an attribute
    assert change(BASE, BASE.replace("LIMIT = 4", "LIMIT = 5")).names == {"LIMIT"}
    assert change(BASE, BASE.replace("LIMIT = 4", "LIMIT = compute()")).opaque


def test_a_new_module_counts_only_for_what_it_does_at_import_and_a_removed_one_for_all():
    assert change(None, BASE) == FileChange()
    assert change(None, BASE + "\n    setup()\n").opaque
    gone = change(BASE, None)
    assert gone.bodies == {"used", "Pool.__init__", "Pool.take"}
    assert {"used", "Pool", "LIMIT"} <= gone.names


def sources(**files: str) -> Dict[str, str]:
    return {f"pkg/{name}.py": textwrap.dedent(text) for name, text in files.items()}


def test_a_changed_name_spreads_to_what_is_built_from_it_at_import():
    base = "class A:\n    X = 1\n"
    child = "from .base import A\n\nclass B(A):\n    pass\n\nALIAS = B\n"
    user = (
        "from __future__ import annotations\nfrom .base import A\n\n"
        "def f(a: A) -> A:\n    return a\n"
    )
    old = sources(base=base, child=child, user=user)
    new = sources(base=base.replace("X = 1", "X = 2"), child=child, user=user)
    names = tree_change(old, new).names
    assert {"A", "B", "ALIAS", ".X"} <= names
    # an annotation that is never evaluated does not make f another function
    assert "f" not in names


def test_why_a_test_reruns():
    old = sources(ops=BASE, side="X = 1\n")
    new = sources(
        ops=BASE.replace("return x + 1", "return x + 2").replace("LIMIT = 4", "LIMIT = 3"),
        side="X = 1\nprint('loaded')\n",
    )
    tc = tree_change(old, new)
    ran = {("pkg/ops.py", "used")}
    assert tc.reasons(ran, set(), set()) == ["used (pkg/ops.py) changed"]
    assert tc.reasons({("pkg/ops.py", "Pool.take")}, set(), set()) == []
    assert tc.reasons(set(), {"LIMIT"}, set())[0].endswith("now: LIMIT")
    assert tc.reasons(set(), {".LIMIT"}, set())  # ops.LIMIT
    assert tc.reasons(set(), set(), {"pkg/side.py"})[0].startswith("pkg/side.py: a statement")


def test_a_changed_member_counts_only_for_code_that_meets_its_class():
    """A tokenizer's `.input_ids` is not a request's: a changed member of `Req` reruns a test
    that reads the attribute only if the test also meets `Req` (its name, a subclass's, an
    alias made at import) or ran one of its methods."""
    req = "class Req:\n    input_ids = None\n\n    def length(self):\n        return 0\n"
    more = "from .req import Req\n\nclass ChunkedReq(Req):\n    pass\n\nR = Req\n"
    resigned = req.replace("length(self)", "length(self, n=0)")  # a method's signature
    tc = tree_change(sources(req=req, more=more), sources(req=resigned, more=more))
    assert tc.names == {".length"} and tc.owners == {".length": {"Req", "ChunkedReq", "R"}}
    assert tc.reasons(set(), {".length", "tokenizer"}, set()) == []
    for met in ("Req", ".Req", "ChunkedReq", "R"):
        assert tc.reasons(set(), {".length", met}, set()), met
    assert tc.reasons({("pkg/req.py", "Req.__init__")}, {".length"}, set())
    # a field changes the class itself too
    field = tree_change(sources(req=req), sources(req=req.replace("= None", "= ()")))
    assert field.reasons(set(), {".input_ids", "tokenizer"}, set()) == []
    assert field.reasons(set(), {"Req"}, set())
    # a member read at import changes what that binds, whoever reads it
    use = "from .req import Req\n\nMEASURE = Req.length\n"
    aliased = tree_change(sources(req=req, use=use), sources(req=resigned, use=use))
    assert aliased.reasons(set(), {"MEASURE"}, set())


def test_what_code_reads():
    code = "import os\nfrom a import b as c\nx = obj.attr\ny = getattr(obj, 'forward')\nz = 1\n"
    import ast

    read = names_in([ast.parse(code)])
    assert {"os", "b", "obj", ".attr", "getattr", "forward", ".forward"} <= read
    assert "x" not in read and ".x" not in read  # bound, not read
    # a changed member is met only by an attribute; a changed module-level name by both
    assert reaches({".attr", ".x", "os", "b"}, read) == {".attr", "os", "b"}
    assert reaches({"attr"}, {".attr"}) == {"attr"}


def test_a_changed_kernel_source_counts_for_the_tests_that_ran_the_code_reading_it():
    """kernel/csrc/jit/store.cu is read by the modules of kernel/, the nearest folder with any.
    A module there that only defines and binds reads it when its functions run: a test that
    can import the module but ran none of them cannot see the change. A module that does
    more at import (it might compile the kernel then) becomes opaque."""
    old = {
        "pkg/kernel/store.py": "def store():\n    return 1\n",
        "pkg/kernel/csrc/jit/store.cu": "// v1\n",
        "pkg/other.py": "X = 1\n",
    }
    new = dict(old, **{"pkg/kernel/csrc/jit/store.cu": "// v2\n"})
    tc = tree_change(old, new)
    assert tc.reasons(set(), set(), {"pkg/kernel/store.py"}) == []
    assert tc.reasons({("pkg/kernel/store.py", "store")}, set(), {"pkg/kernel/store.py"}) == [
        "pkg/kernel/store.py, whose code ran, reads pkg/kernel/csrc/jit/store.cu: changed"
    ]
    assert tc.reasons({("pkg/other.py", "f")}, set(), {"pkg/other.py"}) == []
    at_import = {**old, "pkg/kernel/store.py": old["pkg/kernel/store.py"] + "KERNEL = store()\n"}
    eager = tree_change(at_import, dict(at_import, **{"pkg/kernel/csrc/jit/store.cu": "// v2\n"}))
    assert eager.reasons(set(), set(), {"pkg/kernel/store.py"}) == [
        "pkg/kernel/store.py: pkg/kernel/csrc/jit/store.cu changed"
    ]


def test_making_a_named_tuple_of_the_package_or_reading_an_attribute_is_a_binding():
    """`DEFAULT = KernelConfig(num_threads=128)`, KernelConfig a named tuple of another module
    of the package, only builds a value, as `getattr(mod, "name", None)` only reads one: a new
    module with such lines does nothing at import. A call to anything else does."""
    utils = "from typing import NamedTuple\n\nclass KernelConfig(NamedTuple):\n    n: int\n"
    store = "from .utils import KernelConfig as KC\n\nDEFAULT = KC(n=128)\n"
    other = "import os\n\nF = getattr(os, 'sched_getaffinity', None) or os.cpu_count\n"
    old = sources(utils=utils)
    assert tree_change(old, sources(utils=utils, store=store, other=other)).files == {}
    called = "from .utils import make\n\nDEFAULT = make(n=128)\n"
    maker = utils + "\ndef make(n):\n    return KernelConfig(n)\n"
    tc = tree_change(sources(utils=maker), sources(utils=maker, store=called))
    assert tc.reasons(set(), set(), {"pkg/store.py"})[0].startswith("pkg/store.py: a statement")
    # a class that runs code of its own on construction is not a named tuple here
    hooked = utils + "\n    def __init_subclass__(cls):\n        print(cls)\n"
    tc = tree_change(sources(utils=hooked), sources(utils=hooked, store=store))
    assert tc.reasons(set(), set(), {"pkg/store.py"})
