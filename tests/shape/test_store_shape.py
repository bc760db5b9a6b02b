"""The store's shape stays as D-43 chose it: code on an event loop reaches the store only through its
awaitable face (``store.aio``), which is built once with the store, never at a call site.

A sync store call inside ``async def`` runs a transaction on the event loop: on Postgres that is a round
trip or three during which every other run and the server stand still (docs/decisions.md D-27).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from tether._store import _migrations, base
from tether._store.base import AsyncStore, Capabilities, Store
from tether._store.postgres import PostgresStore
from tether._store.sqlite import SQLiteStore

PACKAGE = Path(__file__).parent.parent.parent / "src" / "tether"

# Every transaction-running method of the protocol's ports. ``close`` releases connections, the secrets are
# held in memory since the store opened, and ``listen`` starts a thread: none of them runs a transaction.
SYNC_METHODS = frozenset(name for name in dir(Store) if not name.startswith("_")
                         and callable(getattr(Store, name))) - {"close", "secret", "previous_secrets", "listen"}


def _chain(node: ast.expr) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def sync_store_calls_in_async(source: str) -> list[tuple[int, str]]:
    """(line, call) for each ``<...>.store.<method>(...)`` or ``store.<method>(...)`` made directly in the
    body of an ``async def``; a nested ``def`` or ``lambda`` is not counted (it may be handed to a thread)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_async: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.AsyncFunctionDef):
                visit(child, True)
            elif isinstance(child, (ast.FunctionDef, ast.Lambda)):
                visit(child, False)
            else:
                if in_async and isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                    chain = _chain(child.func)
                    if len(chain) >= 2 and chain[-2] == "store" and chain[-1] in SYNC_METHODS:
                        found.append((child.lineno, ".".join(chain)))
                visit(child, in_async)

    visit(ast.parse(source), False)
    return found


def test_the_check_sees_a_sync_store_call_planted_in_an_async_def():
    planted = (
        "async def handler(rt, run_id):\n"
        "    run = rt.store.get_run(run_id)\n"            # blocks the loop: found
        "    ok = await rt.store.aio.get_run(run_id)\n"   # awaited face: fine
        "    await rt.astore.call(lambda: store.get_run(run_id))\n"  # runs off the loop: fine
        "    store.close()\n"                              # no transaction: fine
        "    return store.settle_wait(w)\n"                # found
        "def sync(store):\n"
        "    return store.get_run('x')\n"                  # not on a loop: fine
    )
    assert sync_store_calls_in_async(planted) == [(2, "rt.store.get_run"), (6, "store.settle_wait")]


def test_no_sync_store_call_sits_inside_an_async_def():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {call}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line, call in sync_store_calls_in_async(path.read_text())]
    assert found == [], "await the store's face instead (store.aio.<method>):\n" + "\n".join(found)


def _store_call(chain: list[str]) -> bool:
    return len(chain) >= 2 and chain[-2] == "store" and chain[-1] in SYNC_METHODS


def _direct_read(chain: list[str]) -> bool:
    """A store transaction, or ``engine.get_run`` (the run, checked against its principal)."""
    return _store_call(chain) or chain[-2:] == ["engine", "get_run"]


def _defs(tree: ast.AST) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """Every function defined in ``tree``, nested ones too, with whether it is a class's method."""
    out: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]] = []

    def visit(node: ast.AST, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((child, in_class))
                visit(child, False)
            else:
                visit(child, isinstance(child, ast.ClassDef))

    visit(tree, False)
    return out


def _calls_in_body(fn: ast.AST) -> list[ast.Call]:
    """Calls made in ``fn``'s own body: not in a nested ``def`` or ``lambda`` (which may be handed to a thread),
    and a function passed by name (``store.aio.call(helper, ...)``) is not a call."""
    found: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Call):
                found.append(child)
            visit(child)

    visit(fn)
    return found


def sync_reads_through_helpers(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """(module, line, call) for each call, made in the body of an ``async def``, of a sync helper that reads the
    store: a module's own function called by name, or a method called on ``self`` (the console's classes share
    theirs across modules, so methods are looked up among all ``sources``). A helper reads the store when it
    makes a sync store call or ``engine.get_run``, or calls another such helper."""
    trees = {name: _defs(ast.parse(text)) for name, text in sources.items()}
    awaited = {fn.name for defs in trees.values() for fn, _ in defs if isinstance(fn, ast.AsyncFunctionDef)}
    methods: set[str] = set()
    functions: dict[str, set[str]] = {name: set() for name in trees}

    def reads(call: ast.Call, module: str) -> bool:
        chain = _chain(call.func)
        return (_direct_read(chain) or (len(chain) == 1 and chain[0] in functions[module])
                or (len(chain) == 2 and chain[0] == "self" and chain[1] in methods and chain[1] not in awaited))

    grew = True
    while grew:
        grew = False
        for module, defs in trees.items():
            for fn, is_method in defs:
                group = methods if is_method else functions[module]
                if isinstance(fn, ast.AsyncFunctionDef) or fn.name in group:
                    continue
                if any(reads(call, module) for call in _calls_in_body(fn)):
                    group.add(fn.name)
                    grew = True
    # A store call made right in the handler is the check above's (sync_store_calls_in_async).
    return [(module, call.lineno, ".".join(_chain(call.func)))
            for module, defs in trees.items() for fn, _ in defs if isinstance(fn, ast.AsyncFunctionDef)
            for call in _calls_in_body(fn) if reads(call, module) and not _store_call(_chain(call.func))]


def test_the_check_sees_a_store_read_reached_through_a_sync_helper_planted_in_a_handler():
    planted = (
        "def waiting(rt, run_id):\n"
        "    return rt.store.get_run(run_id)\n"
        "def first(rt, run_id):\n"
        "    return waiting(rt, run_id)\n"                     # a helper of a helper reads too
        "class Pages:\n"
        "    def _run_for(self, run_id):\n"
        "        return self.rt.engine.get_run(run_id, None)\n"
        "    async def page(self, run_id):\n"
        "        run = self._run_for(run_id)\n"                 # found
        "        w = first(self.rt, run_id)\n"                  # found
        "        w = await self.rt.store.aio.call(first, self.rt, run_id)\n"  # off the loop: fine
        "        r = await self.rt.store.aio.call(lambda: self._run_for(run_id))\n"  # fine
        "        return self.rt.engine.get_run(run_id, None)\n"  # found
    )
    other = "class More:\n    async def home(self):\n        return self._run_for('x')\n"  # a method of a base class
    assert sync_reads_through_helpers({"pages.py": planted, "more.py": other}) == [
        ("pages.py", 9, "self._run_for"), ("pages.py", 10, "first"), ("pages.py", 13, "self.rt.engine.get_run"),
        ("more.py", 3, "self._run_for")]


def test_no_handler_of_the_server_reads_the_store_through_a_sync_helper():
    """An ``async def`` in the server calls a sync helper that reads the store only through ``store.aio.call``
    (D-27): on Postgres each read is a round trip during which the server answers no other request."""
    server = PACKAGE / "_server"
    sources = {str(path.relative_to(PACKAGE.parent)): path.read_text() for path in sorted(server.rglob("*.py"))}
    found = [f"{module}:{line}: {call}" for module, line, call in sync_reads_through_helpers(sources)]
    assert found == [], "await store.aio.call(helper, ...) or make the helper async:\n" + "\n".join(found)


def test_the_async_face_covers_every_store_method_with_the_same_parameters():
    for name in SYNC_METHODS:
        sync, awaitable = inspect.signature(getattr(Store, name)), inspect.signature(getattr(AsyncStore, name))
        assert inspect.iscoroutinefunction(getattr(AsyncStore, name)), name
        assert list(sync.parameters) == list(awaitable.parameters), name


def test_the_async_face_is_built_only_by_the_store_itself():
    makers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "_store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "AsyncStore":
                makers.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert makers == [], "use store.aio, the face made with the store:\n" + "\n".join(makers)


def test_what_a_backend_can_do_is_declared_not_guessed():
    """Optional features are read from ``store.capabilities``, never probed with getattr or a class's name."""
    probes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node)
            probed = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id in ("getattr", "hasattr") and bool(node.args)
                      and (_chain(node.args[0]) or [""])[-1] == "store")
            # A class's name tested to decide what to do (naming one in a message is fine).
            named = isinstance(node, ast.Compare) and re.search(r"type\((\w+\.)*store\)\.__name__", text)
            if probed or named:
                probes.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text}")
    assert probes == [], "declare it in Capabilities instead:\n" + "\n".join(probes)
    assert SQLiteStore.capabilities == Capabilities()
    assert PostgresStore.capabilities == Capabilities(offloads=True, notifies=True, secret_with_data=True)


PORTS = [base.RunsPort, base.JournalPort, base.LineagePort, base.SnapshotsPort, base.WaitsPort, base.SessionsPort, base.EventsPort,
         base.OutboxPort, base.ListingCachePort, base.SignOutsPort]


def test_the_store_is_its_ports_and_each_backend_has_every_port_method_with_the_same_parameters():
    methods = {name for port in PORTS for name, fn in vars(port).items() if callable(fn) and not name.startswith("_")}
    assert set(Store.__mro__[1:len(PORTS) + 1]) == set(PORTS)
    assert len(methods) == sum(len([n for n, f in vars(p).items() if callable(f) and not n.startswith("_")])
                               for p in PORTS), "a method belongs to one port"
    for backend in (SQLiteStore, PostgresStore):
        for name in sorted(methods):
            declared = inspect.signature(getattr(Store, name))
            assert list(inspect.signature(getattr(backend, name)).parameters) == list(declared.parameters), \
                f"{backend.__name__}.{name}"


def _sqlite_columns(store: SQLiteStore) -> dict[str, set[str]]:
    with store._transaction(write=False) as tx:
        tables = [r[0] for r in tx.run("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
        return {t: {r[1] for r in tx.run(f"PRAGMA table_info({t})").fetchall()}
                for t in tables if not t.startswith("sqlite_")}


def _postgres_columns(store: PostgresStore) -> dict[str, set[str]]:
    with store._transaction(write=False) as tx:
        rows = tx.run("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = ?",
                      (store.schema,)).fetchall()
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(table, set()).add(column)
    return out


def test_the_one_migration_list_gives_both_backends_the_same_tables(tmp_path, pg_url):
    """Rendered for each dialect, the list builds the same tables and columns; only Postgres keeps its
    secret in a table (a SQLite store keeps it in a file beside the database)."""
    import uuid

    import psycopg

    lite = SQLiteStore(f"sqlite:///{tmp_path / 'shape.db'}")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    pg = PostgresStore(pg_url, schema=schema)
    try:
        on_sqlite, on_postgres = _sqlite_columns(lite), _postgres_columns(pg)
        assert lite.schema_version() == pg.schema_version() == len(_migrations.MIGRATIONS)
    finally:
        lite.close()
        pg.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert set(on_postgres) - set(on_sqlite) == {"store_secret"}
    assert {t: on_postgres[t] for t in on_sqlite} == on_sqlite


# sha256 (first 16 hex digits) of each released schema version's statements as each backend runs them, joined
# by NUL: versions 1-10 as the two hand-written lists before they became one list with dialect hooks gave
# them, 11 the column renames' expand step (D-48), 12 the quota buckets (D-54), 13 the indexes that forget
# old buckets (D-56), 15 the webhook watermarks (D-81). A released
# migration is never edited (_migrations.py): a changed digest is a database that would upgrade differently
# from one already upgraded. A new migration appends one digest per backend.
RELEASED = {
    "sqlite": ["d10b736b884d2639", "41c469176112376f", "ee0c872a66ce14b3", "2e60b28916cb7d39", "b0a9bdc606ec465e",
               "9a72ff8f56d60ed2", "6cd36289cf1e6ff0", "c5475bbf79ca7a67", "c68944be38308961", "5bd9a14810a66ed4",
               "3ba527ee087cce58", "ca81e49844642bae", "dde62412d6f8afd9", "24fce02d55da2245",
               "683f5f0228644f7d"],
    "postgres": ["82d30c92be892c82", "cb5ea863ea4c1af0", "b0dbf6c37b07688f", "2e60b28916cb7d39", "b0a9bdc606ec465e",
                 "64ba73961dc4a8d1", "f50baa5f3b2f3db3", "c5475bbf79ca7a67", "c68944be38308961", "6bf05643d57a1918",
                 "3e760dce73149d4e", "9a2c30075573eb2b", "dde62412d6f8afd9", "96cc6239f3ac7d22",
                 "32be586654263b5b"],
}


def test_released_migrations_render_byte_identical_for_each_backend():
    import hashlib

    for backend in (SQLiteStore, PostgresStore):
        dialect = {SQLiteStore: "sqlite", PostgresStore: "postgres"}[backend]
        rendered = [hashlib.sha256("\0".join(m).encode()).hexdigest()[:16] for m in backend.migrations]
        assert rendered == RELEASED[dialect], f"{dialect}: a released migration's SQL changed"
    assert len(SQLiteStore.migrations) == len(PostgresStore.migrations) == len(_migrations.MIGRATIONS)
