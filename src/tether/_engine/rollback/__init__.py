"""Undoing what a run did (P-46, D-67, D-68): a person's decline-and-undo of a paused run, or an undo of an
ended one.

    plan.py    the plan (what each applied write's compensation is, or why it is not undone) and the one pure
               decision every backend shares: what to do next, read off the journal
    runner.py  begin a rollback (the plan recorded on the run, signed, before anything is sent) and carry it
               out: each compensation a journaled write of its own, newest first, never sent twice
"""
