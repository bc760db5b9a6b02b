"""The notification outbox in SQL, part of ``SQLStore`` (_schema.py): webhook deliveries queued, claimed and
settled (P-34), and what reconciles them with the stored runs (P-49, D-81): each webhook's watermark (migration
15's ``outbox_watermarks``), the runs changed since it, and which events the outbox already holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ContextManager, Protocol, Sequence

from tether._store._rows import OUTBOX_COLUMNS, _decode, _select
from tether._store.base import OUTBOX_PENDING, Conflict, OutboxRecord, RunChange


class _Tx(Protocol):
    """What these methods use of ``_schema.Tx`` (named here: _schema imports this module)."""

    def run(self, sql: str, params: Sequence[Any] = ()) -> Any: ...


class OutboxSQL:
    """The OutboxPort's methods (and ``run_changes``, what reconciling reads) over ``SQLStore``'s transactions."""

    text_bytes: str

    if TYPE_CHECKING:
        def _transaction(self, write: bool, conflict: str | None = None, run_id: str | None = None,
                         single: bool = False, pipelined: bool = False) -> ContextManager[_Tx]: ...

    def add_outbox(self, target: str, event_id: str, body: str, now: float, mac: str | None = None) -> bool:
        sql = ("INSERT INTO outbox (target, event_id, body, status, attempts, next_at, created_at, mac)"
               " VALUES (?, ?, ?, ?, 0, ?, ?, ?)")
        try:
            with self._transaction(write=True, single=True) as tx:
                tx.run(sql, (target, event_id, body, OUTBOX_PENDING, now, now, mac))
        except Conflict:
            return False
        return True

    def claim_outbox(self, now: float, lease_seconds: float, limit: int = 20) -> list[OutboxRecord]:
        # Its text read as bytes: a row whose text is not UTF-8 (edited outside tether; SQLite takes any bytes) is
        # claimed and given up unsent by its MAC (notify.py), rather than failing every claim, every delivery.
        as_bytes = {name: self.text_bytes.format(name) for name in _OUTBOX_TEXTS}
        select = (f"{_select('outbox', OUTBOX_COLUMNS, as_bytes)} WHERE status = ? AND next_at <= ?"
                  " AND (claimed_until IS NULL OR claimed_until < ?) ORDER BY next_at, id LIMIT ?")
        claim = ("UPDATE outbox SET claimed_until = ? WHERE id = ? AND status = ?"
                 " AND (claimed_until IS NULL OR claimed_until < ?)")
        out = []
        with self._transaction(write=True) as tx:
            rows = tx.run(select, (OUTBOX_PENDING, now, now, limit)).fetchall()
            for row in rows:
                fields = _decode(OUTBOX_COLUMNS, row)
                for name in _OUTBOX_TEXTS:
                    if fields[name] is not None:
                        fields[name] = bytes(fields[name]).decode("utf-8", "replace")
                rec = OutboxRecord(**fields)
                if tx.run(claim, (now + lease_seconds, rec.id, OUTBOX_PENDING, now)).rowcount == 1:
                    rec.claimed_until = now + lease_seconds
                    out.append(rec)
        return out

    def settle_outbox(self, id: int, *, status: str, attempts: int, next_at: float,
                      last_error: str | None = None, delivered_at: float | None = None) -> None:
        sql = ("UPDATE outbox SET status = ?, attempts = ?, next_at = ?, last_error = ?, delivered_at = ?,"
               " claimed_until = NULL WHERE id = ?")
        with self._transaction(write=True, single=True) as tx:
            tx.run(sql, (status, attempts, next_at, last_error, delivered_at, id))

    def list_outbox(self, status: str | None = None, limit: int = 100) -> list[OutboxRecord]:
        where, params = ("WHERE status = ? ", [status]) if status is not None else ("", [])
        sql = f"{_select('outbox', OUTBOX_COLUMNS)} {where}ORDER BY id LIMIT ?"
        with self._transaction(write=False, single=True) as tx:
            return [OutboxRecord(**_decode(OUTBOX_COLUMNS, row)) for row in tx.run(sql, params + [limit]).fetchall()]

    def outbox_known(self, event_ids: Sequence[str]) -> set[tuple[str, str]]:
        ids = sorted(set(event_ids))
        if not ids:
            return set()
        sql = f"SELECT target, event_id FROM outbox WHERE event_id IN ({', '.join('?' * len(ids))})"
        with self._transaction(write=False, single=True) as tx:
            return {(target, event_id) for target, event_id in tx.run(sql, ids).fetchall()}

    def outbox_watermarks(self, targets: Sequence[str], start: float) -> dict[str, float]:
        # Insert-or-ignore: the first replica to see a target starts its watermark; the others read it.
        insert = "INSERT INTO outbox_watermarks (target, watermark) VALUES (?, ?) ON CONFLICT (target) DO NOTHING"
        wanted = sorted(set(targets))
        with self._transaction(write=True) as tx:
            for target in wanted:
                tx.run(insert, (target, start))
            rows = tx.run(f"SELECT target, watermark FROM outbox_watermarks WHERE target IN ({', '.join('?' * len(wanted))})",
                          wanted).fetchall() if wanted else []
        # One that is not a time (text on SQLite, NaN on Postgres: edited outside tether) is read as ``start``,
        # as one edited into the future is read at the settle margin (D-81): it must not stop reconciliation.
        return {target: _time_or(watermark, start) for target, watermark in rows}

    def advance_outbox_watermark(self, target: str, watermark: float) -> None:
        with self._transaction(write=True, single=True) as tx:
            tx.run("UPDATE outbox_watermarks SET watermark = ? WHERE target = ? AND watermark < ?",
                   (watermark, target, watermark))

    def run_changes(self, statuses: Sequence[str], since: float, after: str = "",
                    limit: int = 200) -> list[RunChange]:
        if not statuses:
            return []
        sql = (f"SELECT run_id, status, updated_at, {self.text_bytes.format('pending')} FROM runs"
               f" WHERE status IN ({', '.join('?' * len(statuses))})"
               " AND (updated_at > ? OR (updated_at = ? AND run_id > ?)) ORDER BY updated_at, run_id LIMIT ?")
        with self._transaction(write=False, single=True) as tx:
            rows = tx.run(sql, [*statuses, since, since, after, limit]).fetchall()
        # A time that is not one (text on SQLite, NaN on Postgres: edited outside tether) leaves its run out
        # rather than failing every pass; both backends sort such values after every number, so a page cut
        # short by them has read every run that can be read (D-81).
        return [RunChange(run_id, str(status), at, None if pending is None else bytes(pending).decode("utf-8", "replace"))
                for run_id, status, updated_at, pending in rows if (at := _time_or(updated_at, None)) is not None]


# The outbox's text columns a claim reads as bytes (claim_outbox).
_OUTBOX_TEXTS = ("target", "event_id", "body", "last_error", "mac")


def _time_or(value: Any, default: Any) -> Any:
    """A stored time as a float, or ``default`` when the column holds something else (text, NaN)."""
    try:
        at = float(value)
    except (TypeError, ValueError):
        return default
    return default if at != at else at
